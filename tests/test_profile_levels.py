"""scripts/profile_levels.py folds py-spy's collapsed stacks per level and finds what grew in the slow levels."""

import pytest

from scripts_loader import load_script


def _module():
    return load_script("profile_levels")


def test_fold_counts_the_innermost_function_whatever_its_line():
    folded = _module().fold([
        "main (a.py:1);step (b.py:10);Linear.forward (torch/nn/modules/linear.py:125) 7",
        "main (a.py:1);step (b.py:12);Linear.forward (torch/nn/modules/linear.py:130) 3",
        "main (a.py:1);step (b.py:11) 5",
        "",
    ])
    assert folded == {"samples": 15, "leaf": {"Linear.forward (torch/nn/modules/linear.py)": 10, "step (b.py)": 5}}


def test_fold_refuses_a_line_without_a_count():
    with pytest.raises(ValueError, match="collapsed-stack"):
        _module().fold(["main (a.py:1);step (b.py:10)"])


def _level(tpot, matmul, scheduler):
    return {"arm": "a", "tpot": tpot, "samples": matmul + scheduler, "leaf": {"matmul": matmul, "sched": scheduler}}


def test_one_component_that_grows_leads_the_list():
    levels = [_level(5.0, 100, 20), _level(5.1, 100, 21), _level(5.2, 101, 20),
              _level(6.0, 100, 60), _level(6.1, 101, 59), _level(6.2, 100, 61)]
    result = _module().compare_thirds(levels, top=2)
    assert result["grown"][0]["function"] == "sched"
    assert result["grown"][0]["factor"] == pytest.approx(60 / 20.5, abs=0.01)
    assert result["grown"][1]["factor"] == pytest.approx(1.0, abs=0.01)


def test_a_uniform_slowdown_grows_every_function_alike():
    levels = [_level(5.0, 100, 20), _level(5.0, 102, 20), _level(6.0, 120, 24), _level(6.0, 121, 24)]
    result = _module().compare_thirds(levels)
    factors = {row["function"]: row["factor"] for row in result["grown"]}
    assert factors["matmul"] == pytest.approx(1.2, abs=0.02) and factors["sched"] == pytest.approx(1.2, abs=0.02)
    assert result["uniform"] == pytest.approx(1.0, abs=1e-6)
