"""Factorial attribution designs and the arms they generate (harness.judge.factorial, harness.run.factors), the
schedule of N arms, and the one-line refusals of a bad factor spec (exit 2, nothing started)."""

import itertools
import math
import re
from pathlib import Path

import pytest

from harness.cli import main
from harness.judge.factorial import aliases, arm_name, design_rows, effect_terms
from harness.run import plan as plan_mod
from harness.run.machine import detect
from harness.run.models import locate
from harness.run.scenario import load_scenario
from harness.run.start import block_arms, schedule

SCENARIOS = Path(__file__).resolve().parents[1] / "scenarios"
CPU = "cpu-tiny-dsa-attribution"


def _column(rows, term):
    return [math.prod(2 * row[i] - 1 for i in term) for row in rows]


def test_full_designs_are_every_combination_in_standard_order():
    for k in range(1, 5):
        rows = design_rows(k)
        assert sorted(rows) == sorted(itertools.product((0, 1), repeat=k)) and len(set(rows)) == 2 ** k
    assert design_rows(2) == [(0, 0), (1, 0), (0, 1), (1, 1)]


def test_the_half_fraction_is_d_equals_abc_of_resolution_iv():
    rows = design_rows(4, "half")
    assert len(rows) == 8 and len(set(rows)) == 8
    assert all(_column([r], (3,)) == _column([r], (0, 1, 2)) for r in rows)   # generator D = ABC
    mains = [(i,) for i in range(4)]
    pairs = list(itertools.combinations(range(4), 2))
    for main_term, pair in itertools.product(mains, pairs):   # mains clear of every 2FI: resolution IV
        assert sum(a * b for a, b in zip(_column(rows, main_term), _column(rows, pair))) == 0
    assert _column(rows, (0, 1)) == _column(rows, (2, 3))     # AB = CD: aliased, as stated
    assert aliases(4, "half") == {"A": "BCD", "B": "ACD", "C": "ABD", "D": "ABC", "AB": "CD", "AC": "BD", "AD": "BC"}
    assert effect_terms(4, "half") == [(0,), (1,), (2,), (3,), (0, 1), (0, 2), (0, 3)]
    assert aliases(3) == {} and len(effect_terms(3)) == 6


def test_the_cpu_scenario_generates_eight_arms_with_summed_delays_and_the_injected_interaction():
    scenario = load_scenario(CPU)
    arms = scenario.run_arms()
    assert list(arms) == [arm_name(r) for r in design_rows(3)] == scenario.arm_names()
    assert arms["f000"].knobs == {} and arms["f000"].inject is None
    assert arms["f100"].knobs == {"compilation_mode": "NONE"}
    assert arms["f010"].inject == "step-delay:8" and arms["f001"].inject == "step-delay:14"
    assert arms["f011"].inject == arms["f111"].inject == "step-delay:62"   # 8 + 14 + the 40 ms interaction


def test_the_plan_carries_every_generated_arm_from_the_routing_decision(tmp_path, monkeypatch):
    monkeypatch.setenv("DSA_BENCH_CACHE", str(tmp_path / "cache"))
    scenario = load_scenario(CPU).effective()
    plan = plan_mod.build_plan(scenario, detect(), locate(scenario))
    assert [a.name for a in plan.arms] == scenario.arm_names() and plan_mod.same_commands(plan.arms) == []
    modes = {a.name: a.intended["compilation_mode"] for a in plan.arms}
    assert {n for n, m in modes.items() if m == "NONE"} == {"f100", "f110", "f101", "f111"}
    assert {n for n, m in modes.items() if m == "DYNAMO_TRACE_ONCE"} == {"f000", "f010", "f001", "f011"}
    assert all(a.decision.route == "baseline" for a in plan.arms)
    assert plan.arms[3].intended["injection"] == "step-delay:8" and not any(a.refusals for a in plan.arms)


def test_n_arms_run_once_per_block_in_a_seeded_order_and_two_arms_keep_theirs(tmp_path, monkeypatch):
    monkeypatch.setenv("DSA_BENCH_CACHE", str(tmp_path / "cache"))
    scenario = load_scenario(CPU).effective()
    plan = plan_mod.build_plan(scenario, detect(), locate(scenario))
    order = schedule(plan)
    names = scenario.arm_names()
    blocks = [[arm for arm, _, r in order if r == block] for block in range(3)]
    assert all(sorted(b) == sorted(names) for b in blocks) and len(order) == 24
    assert blocks == [block_arms(names, 0, b) for b in range(3)] and len({tuple(b) for b in blocks}) == 3
    assert block_arms(["baseline", "candidate"], 0, 0) in (["baseline", "candidate"], ["candidate", "baseline"])


def _with_factors(tmp_path: Path, factors: str) -> Path:
    text = (SCENARIOS / f"{CPU}.toml").read_text()
    text = text[:text.index("[[attribution.factors]]")] + factors
    path = tmp_path / "s.toml"
    path.write_text(text)
    return path


KNOB = '[[attribution.factors]]\nname = "{name}"\nknob = "{knob}"\n\n'
DELAY = '[[attribution.factors]]\nname = "{name}"\ninject = "step-delay:{ms}"\n\n'


@pytest.mark.parametrize("factors, message", [
    (KNOB.format(name="a", knob="turbo"), "unknown knob 'turbo'"),
    (KNOB.format(name="a", knob="compilation_mode") + DELAY.format(name="a", ms=5), "factor a is given twice"),
    (KNOB.format(name="a", knob="compilation_mode") + KNOB.format(name="b", knob="compilation_mode"),
     "knob compilation_mode is the knob of two factors"),
    ("".join(DELAY.format(name=f"d{i}", ms=i + 1) for i in range(5)), "5 factors: an attribution takes 1 to 4"),
    (KNOB.format(name="g", knob="breakable_cudagraph") + KNOB.format(name="m", knob="compilation_mode")
     + '[[attribution.factors]]\nname = "m2"\nknob = "model_runner"\n\n',
     "breakable_cudagraph=on with compilation_mode=VLLM_COMPILE"),
    ('[[attribution.factors]]\nname = "x"\n\n', "factor x changes nothing"),
])
def test_a_bad_factor_spec_is_one_line_and_exit_2_and_starts_nothing(tmp_path, capsys, factors, message):
    path = _with_factors(tmp_path, factors)
    for argv in (["attribute", "--scenario", str(path), "--plan"],
                 ["attribute", "--scenario", str(path), "--out", str(tmp_path / "results")]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err
    assert not (tmp_path / "results").exists()


def test_a_combination_vllm_refuses_on_this_platform_is_refused_in_the_plan(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("DSA_BENCH_CACHE", str(tmp_path / "cache"))
    path = _with_factors(tmp_path, KNOB.format(name="runner", knob="model_runner") + DELAY.format(name="d", ms=5))
    assert main(["attribute", "--scenario", str(path), "--plan"]) == 2
    err = capsys.readouterr().err
    assert re.search(r"arm f10: model_runner=v2 on cpu without Triton.*Model Runner V2 requires Triton", err)
    assert err.count("\n") == 1


def test_a_factor_that_changes_nothing_here_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("DSA_BENCH_CACHE", str(tmp_path / "cache"))
    path = _with_factors(tmp_path, KNOB.format(name="impl", knob="implementation") + DELAY.format(name="d", ms=5))
    assert main(["attribute", "--scenario", str(path), "--plan"]) == 2
    err = capsys.readouterr().err
    assert "arms f00 and f10 resolve to the same server command" in err and err.count("\n") == 1


def test_compare_and_attribute_each_refuse_the_other_kind_of_scenario(capsys):
    assert main(["compare", "--scenario", CPU]) == 2
    assert "run it with dsa-bench attribute" in capsys.readouterr().err
    assert main(["attribute", "--scenario", "cpu-tiny-dsa", "--plan"]) == 2
    assert "has no [attribution] factors" in capsys.readouterr().err


def test_the_gpu_attribution_plan_lists_every_arm_path_and_the_cost(capsys):
    assert main(["attribute", "--scenario", "glm-5.2-nvfp4-tp4-attribution", "--plan"]) == 0
    out = capsys.readouterr().out
    assert "2^(4−1) fraction, D = ABC" in out and "AB=CD" in out and "32 server sessions" in out
    assert re.search(r"GPU-hours \(4 GPUs held\)", out)
    assert sum(f"== arm {arm_name(r)} " in out for r in design_rows(4, "half")) == 8
    assert "`dsa-bench attribute` would refuse on this machine" in out and "`dsa-bench compare`" not in out


def test_a_knob_that_meets_the_routes_own_breakable_graphs_is_refused_in_one_line(tmp_path, capsys):
    """An attribution whose arms start from the candidate route (breakable graphs on) with a compilation-mode factor:
    its VLLM_COMPILE arms would run as NONE in vLLM (the cross-check test shows vLLM resolving it so), so the plan
    refuses the design — one line, exit 2, nothing started."""
    path = tmp_path / "s.toml"
    path.write_text(f'include = "{SCENARIOS / "glm-5.2-nvfp4-tp4-attribution.toml"}"\nname = "x"\n'
                    'allow_identical_arms = true\n\n[arms.baseline]\nroute = "candidate"\n\n'
                    '[[attribution.factors]]\nname = "compile"\nknob = "compilation_mode"\nlow = "NONE"\n'
                    'high = "VLLM_COMPILE"\n\n[[attribution.factors]]\nname = "eager"\nknob = "mtp_draft_eager"\n'
                    'low = "off"\nhigh = "on"\n')
    assert main(["attribute", "--scenario", str(path), "--plan"]) == 2   # a run on a GPU node plans the same way
    err = capsys.readouterr().err
    assert re.search(r"arm f10: breakable_cudagraph=on with compilation_mode=VLLM_COMPILE", err) and \
        err.count("\n") == 1, err
