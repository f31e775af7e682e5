"""The run directory ``results/<run-id>/``: its schema and the one store every reader and writer goes through."""
