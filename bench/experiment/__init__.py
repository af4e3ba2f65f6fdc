"""The scaling experiment on the user's own Ray cluster: ``responses-ws bench scaling
--cluster ADDRESS|auto`` (bench/experiment/experiment.py; docs/scaling.md, "Run a scaling
experiment on your cluster")."""
