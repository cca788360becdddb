"""The capture service: robots stream episodes over HTTP; the service commits them to bucket datasets."""
