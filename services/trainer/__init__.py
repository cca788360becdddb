"""The training service: jobs run `robotloop train` as subprocesses; clients submit, watch and cancel them over HTTP."""
