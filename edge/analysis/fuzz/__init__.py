"""Bad input, fuzzed (`bitnest fuzz-inputs`): the mutations and the tally of outcomes (`mutations`), every reader
the runtime has driven with them (`readers`) and what a correct outcome is for each (`oracle`)."""
