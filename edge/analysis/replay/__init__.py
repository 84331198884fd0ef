"""Precision on Demand's replay (`bitnest replay`): step traces along the target's greedy trajectory (`trace`),
their analysis (AUCs, budgets, the byte cost model, speculation replayed: `analyse`) and its figures (`plots`)."""
