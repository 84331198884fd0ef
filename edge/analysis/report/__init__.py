"""The docs' result tables (`bitnest tables`): renderers of the committed JSON under scripts/results (`tables`,
`bench`, `shapes`, `cells`) and the rewrite of the marked tables in README.md and docs/ (`tables`)."""
