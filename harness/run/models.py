"""Where a scenario's model is: a local directory, a Hugging Face id, or a ``generated:<name>`` tiny checkpoint that
:mod:`dsa_route.tiny` generates into its cache on first use (seconds; torch for the DSA preset)."""

from __future__ import annotations

from pathlib import Path

from harness.run.plan import ModelLocation, PlanError
from harness.run.scenario import Scenario, resolve_path


def locate(scenario: Scenario) -> ModelLocation:
    """The model path or id and the tokenizer path or id of ``scenario`` (a generated model is made on first use).

    Raises:
        PlanError: a local-looking model path that does not exist.
    """
    model = scenario.model
    if model.id.startswith("generated:"):
        from dsa_route.tiny import ensure_model

        path = str(ensure_model(model.id.split(":", 1)[1]))
        return ModelLocation(path, model.tokenizer or path)
    local = resolve_path(model.id)
    if not local.exists() and (model.id.startswith(("/", "./", "../", "~")) or Path(model.id).expanduser().exists()):
        raise PlanError(f"model path {model.id} does not exist; pass an existing directory or a Hugging Face id")
    path = str(local) if local.exists() else model.id
    return ModelLocation(path, model.tokenizer or path)
