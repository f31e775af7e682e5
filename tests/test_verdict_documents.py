"""``dsa-bench compare``, ``report``, ``gate``, ``import`` and ``calibrate`` on the committed recordings give the
verdict documents they gave before the front-half refactor (``tests/fixtures/verdicts/``, made by
``tests/verdict_documents.py`` on the code before it; how to refresh: that module's docstring)."""

import json

import pytest

from tests import verdict_documents


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    return verdict_documents.documents(tmp_path_factory.mktemp("verdicts"))


@pytest.mark.parametrize("name", sorted(p.stem for p in verdict_documents.EXPECTED.glob("*.json")))
def test_each_command_gives_the_recorded_verdict_document(made, name):
    expected = json.loads((verdict_documents.EXPECTED / f"{name}.json").read_text(encoding="utf-8"))
    assert json.loads(verdict_documents.dump(made[name])) == expected


def test_every_case_has_an_expected_document(made):
    assert sorted(made) == sorted(p.stem for p in verdict_documents.EXPECTED.glob("*.json"))
