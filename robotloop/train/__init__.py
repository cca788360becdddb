"""Training: streaming ACT trainer (model step in `robotloop.train.policy`)."""
