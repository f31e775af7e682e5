"""Calibration injections (dsa_route.inject): parsing, the scenario setting, the plan's server env, the plugin line,
attestation, the report, and the hooks of dsa_route's CPU DSA classes (fast, no server)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch

from dsa_route.dsa.injections import CORRECT, Defect, install
from dsa_route.dsa.topk import topk_indices
from dsa_route.inject import ALLOWED, DEFECTS, ENV_INJECT, KINDS, Injection, injection_from_env, parse_injection
from dsa_route.tiny.arith.sensitivity import INJECTIONS
from harness.run import procs
from harness.run.attest import attest, compare_paths, observe_from_log
from harness.rundir.schema import Observation
from harness.run.scenario import ScenarioError, load_scenario


@pytest.mark.parametrize("text,kind,params,spec", [
    ("topk-random", "topk-random", {}, "topk-random"),
    (" indexer-rope-flip ", "indexer-rope-flip", {}, "indexer-rope-flip"),
    ("step-delay:50", "step-delay", {"ms": 50.0}, "step-delay:50"),
    ("step-delay:2.5", "step-delay", {"ms": 2.5}, "step-delay:2.5"),
])
def test_parse_round_trips_through_the_spec(text, kind, params, spec):
    injection = parse_injection(text)
    assert (injection.kind, dict(injection.params), injection.spec) == (kind, params, spec)
    assert parse_injection(injection.spec) == injection
    assert injection_from_env({ENV_INJECT: text}) == injection


def test_step_delay_seconds_and_record():
    injection = parse_injection("step-delay:40")
    assert injection.delay_s == pytest.approx(0.04)
    assert injection.record() == {"kind": "step-delay", "params": {"ms": 40.0}}
    assert parse_injection("topk-random").delay_s == 0.0


@pytest.mark.parametrize("text", [None, "", "  "])
def test_unset_means_no_injection(text):
    assert parse_injection(text) is None
    assert injection_from_env({}) is None


@pytest.mark.parametrize("text,needle", [
    ("topk-inverted", ALLOWED), ("step-delay", "milliseconds"), ("step-delay:abc", "milliseconds"),
    ("step-delay:0", "(0, 10000]"), ("step-delay:-5", "(0, 10000]"), ("step-delay:nan", "(0, 10000]"),
    ("step-delay:1e9", "(0, 10000]"), ("topk-random:3", "takes no parameter"),
])
def test_bad_values_raise_naming_what_is_allowed(text, needle):
    with pytest.raises(ValueError, match="inject") as error:
        parse_injection(text)
    assert needle in str(error.value)


# ---- tensors ---------------------------------------------------------------------------------------------------------
def _causal_logits(S: int, T: int, seed: int = 0) -> torch.Tensor:
    logits = torch.randn(S, T, generator=torch.Generator().manual_seed(seed))
    visible = torch.arange(T)[None, :] <= (torch.arange(S)[:, None] + T - S)
    return logits.masked_fill(~visible, float("-inf"))


def _select(kind: str, logits: torch.Tensor, k: int, seed: int = 0) -> torch.Tensor:
    return Defect(DEFECTS[kind], torch.Generator().manual_seed(seed)).select(logits, k)


def _rows(out: torch.Tensor) -> list[set[int]]:
    return [set(int(i) for i in row if i >= 0) for row in out]


def test_the_catalogue_is_the_one_setting_and_names_its_sources():
    assert set(KINDS) == {*DEFECTS, "step-delay"} and all(kind in ALLOWED for kind in KINDS)
    assert sum(spec.harmful for spec in DEFECTS.values()) == 13
    assert [k for k, spec in DEFECTS.items() if not spec.harmful] == ["topk-order", "topk-tie-last"]
    assert all(len(spec.cites) > 20 for spec in DEFECTS.values())
    assert [k for k, spec in DEFECTS.items() if spec.min_spec_tokens] == ["mtp-hidden-unnormed"]
    assert "mtp-hidden-unnormed" not in INJECTIONS and set(INJECTIONS) < set(DEFECTS)


def test_topk_random_keeps_the_topk_contract_and_differs_from_the_indexer():
    S, T, K = 24, 40, 8
    logits = _causal_logits(S, T)
    out = _select("topk-random", logits, K)
    assert out.dtype == torch.int32 and out.shape == (S, K)
    visible = (logits != float("-inf")).sum(-1)
    for s in range(S):
        row = out[s]
        chosen = row[row >= 0]
        assert len(chosen) == min(K, int(visible[s]))                       # min(K, visible) keys, then -1 padding
        assert bool((row[len(chosen):] == -1).all())
        assert bool((chosen[1:] > chosen[:-1]).all())                       # ascending and distinct
        assert bool((logits[s, chosen.long()] != float("-inf")).all())      # only keys the query may see
    assert not torch.equal(out, topk_indices(logits, K))                   # not the indexer's selection
    assert torch.equal(out, _select("topk-random", logits, K))              # seeded


def test_topk_random_is_uniform_over_visible_keys():
    T, K, draws = 10, 3, 4000
    logits = torch.arange(T, dtype=torch.float32).expand(draws, T).clone()  # the indexer would always pick 7, 8, 9
    out = _select("topk-random", logits, K, seed=1)
    counts = torch.bincount(out.flatten().long(), minlength=T).float() / draws
    assert torch.allclose(counts, torch.full((T,), K / T), atol=0.03)


def test_lost_key_drops_the_lowest_selected_key_only_where_the_row_had_to_choose():
    S, T, K = 24, 40, 8
    logits = _causal_logits(S, T, seed=3)
    exact, lost = _rows(topk_indices(logits, K)), _rows(_select("topk-lost-key", logits, K))
    visible = (logits != float("-inf")).sum(-1)
    for s in range(S):
        if visible[s] > K:
            (dropped,) = exact[s] - lost[s]
            assert lost[s] < exact[s] and dropped == min(exact[s], key=lambda i: float(logits[s, i]))
        else:
            assert lost[s] == exact[s]


def test_coarse_bins_are_order_preserving_and_a_quarter_octave_wide():
    """The stage-1 bins of the radix top-k: [1.0, 1.25) is one bin (vLLM #51782's boundary), 1.25 the next; order
    is kept across signs and zero."""
    from dsa_route.dsa.injections import coarse_bin

    values = torch.tensor([-3.0, -1.0, -0.5, 0.0, 0.3, 1.0, 1.1, 1.244, 1.25, 2.0, 40.0])
    bins = coarse_bin(values)
    assert bool((bins[1:] >= bins[:-1]).all()) and bins.dtype == torch.int32
    assert len({int(b) for b in bins[5:8]}) == 1 and int(bins[8]) == int(bins[7]) + 1
    assert int(bins[0]) < int(bins[1]) < int(bins[3]) < int(bins[4])


def test_bin_overflow_takes_the_threshold_bin_in_arrival_order():
    """Keys above the k-th score's coarse bin are kept; the threshold bin's keys are taken by key index, not score;
    a row with no choice, or whose threshold bin holds just what it needs, is the exact top-k."""
    logits = torch.tensor([[1.10, 1.20, 5.0, 1.05, 1.24, 0.1, 0.2, 0.3],
                           [1.10, 1.20, 5.0, 7.0, 3.0, 0.1, 0.2, 0.3],
                           [1.10, float("-inf"), 5.0, float("-inf"), float("-inf"), float("-inf"), float("-inf"),
                            float("-inf")]])
    out = _select("topk-bin-overflow", logits, 3)
    assert _rows(out) == [{0, 1, 2}, {2, 3, 4}, {0, 2}]
    assert _rows(topk_indices(logits, 3))[0] == {1, 2, 4}                   # by score: 1.24 and 1.20, not 1.10
    assert out[2].tolist() == [0, 2, -1] and out.dtype == torch.int32
    S, T, K = 24, 40, 8
    logits = _causal_logits(S, T, seed=5)
    exact, overflow = _rows(topk_indices(logits, K)), _rows(_select("topk-bin-overflow", logits, K))
    visible = (logits != float("-inf")).sum(-1)
    assert all(len(o) == min(K, int(v)) for o, v in zip(overflow, visible))
    assert any(o != e for o, e in zip(overflow, exact)) and any(o == e for o, e, v in zip(overflow, exact, visible)
                                                                  if v > K)


def test_pad_zero_reads_the_padding_of_short_rows_as_key_zero():
    S, T, K = 24, 40, 30
    logits = _causal_logits(S, T, seed=4)
    exact, padded = topk_indices(logits, K), _select("topk-pad-zero", logits, K)
    assert bool((padded >= 0).all()) and bool((exact < 0).any())
    assert torch.equal(torch.where(exact >= 0, exact, 0), padded.to(exact.dtype))


def test_index_topk_half_keeps_half_the_width_and_pads_the_rest():
    logits = _causal_logits(16, 64, seed=5)
    out = _select("index-topk-half", logits, 16)
    assert out.shape == (16, 16) and bool((out[:, 8:] == -1).all())
    assert _rows(out) == _rows(topk_indices(logits, 8))


def test_the_harmless_defects_select_the_same_key_sets():
    logits = _causal_logits(24, 40, seed=6)
    exact = topk_indices(logits, 8)
    ordered = _select("topk-order", logits, 8)
    assert _rows(ordered) == _rows(exact) and not torch.equal(ordered, exact)
    assert torch.equal(_select("topk-tie-last", logits, 8), exact.to(torch.int32))  # no ties: identical
    tied = torch.zeros(1, 12)                                                        # all tied: the other end wins
    assert _rows(_select("topk-tie-last", tied, 4)) == [{8, 9, 10, 11}] and _rows(topk_indices(tied, 4)) == [{0, 1, 2, 3}]


def test_visibility_and_stale_key_change_what_the_indexer_reads():
    keys, key_end = torch.ones(10, 4), torch.tensor([1, 5, 10])
    newest = torch.tensor([9])
    same_keys, same_end = CORRECT.index_keys(keys, key_end, None, newest)
    assert torch.equal(same_keys, keys) and torch.equal(same_end, key_end)
    _, shifted = Defect(DEFECTS["visibility-off-by-one"]).index_keys(keys, key_end, None, newest)
    assert shifted.tolist() == [1, 4, 9]                                   # each query keeps its first key
    stale, _ = Defect(DEFECTS["stale-index-key"]).index_keys(keys, key_end, None, newest)
    assert stale[9].abs().sum() == 0 and bool((stale[:9] == 1).all()) and bool((keys == 1).all())


def test_softmax_scale_and_fp8_floor():
    assert Defect(DEFECTS["softmax-scale-large"]).softmax_scale(0.5) == pytest.approx(0.5 * 1.874, rel=1e-3)
    assert Defect(DEFECTS["softmax-scale-small"]).softmax_scale(0.5) == pytest.approx(0.5 * 1.069, rel=1e-3)
    q = torch.randn(4, 128, generator=torch.Generator().manual_seed(7)) * 3
    correct, floored = CORRECT.fp8_query(q, 128), Defect(DEFECTS["indexer-fp8-scale-floor"]).fp8_query(q, 128)
    assert (correct - q).abs().max() < 0.1 * q.abs().max()                  # ue8m0 rounded up: no saturation
    assert (floored - q).abs().max() > (correct - q).abs().max()            # rounded down: the largest saturate


def _tiny_reference():
    from dsa_route.dsa import DsaForCausalLM
    from dsa_route.tiny.v32 import TinyDsaSpec

    torch.manual_seed(0)
    return DsaForCausalLM(TinyDsaSpec().dsa_config(), dtype=torch.float32).init_random(0)


@pytest.mark.parametrize("kind", sorted(INJECTIONS))
def test_install_reaches_the_reference_model_and_none_restores_it(kind):
    """Every greedy-visible defect changes the reference logits on a prompt past index_topk (32); the harmless ones
    leave them equal up to summation order; ``install(model, None)`` restores the correct path exactly."""
    model = _tiny_reference()
    prompt = torch.randint(0, model.config.vocab_size, (1, 96), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        before = model(prompt)
        installed = install(model, kind)
        changed = model(prompt)
        install(model, None)
        restored = model(prompt)
    assert installed.spec is DEFECTS[kind] and torch.equal(before, restored)
    if DEFECTS[kind].harmful:
        assert not torch.allclose(before, changed, atol=1e-5)
    else:
        assert torch.allclose(before, changed, atol=1e-4)


def test_install_refuses_a_kind_outside_the_catalogue():
    with pytest.raises(ValueError, match="not a catalogue defect"):
        install(_tiny_reference(), "step-delay")


def test_vllm_cpu_hook_applies_each_kind_to_the_model(capsys):
    pytest.importorskip("vllm")
    from dsa_route.vllm_cpu.model import apply_injection

    model = _tiny_reference()
    model.used_layers = tuple(range(model.config.num_hidden_layers))
    capsys.readouterr()
    attns = [model.model.layers[i].self_attn for i in model.used_layers]

    assert apply_injection(model, None, "decoder") is None
    assert all(a.defect is CORRECT and not getattr(a, "step_delay_s", 0.0) for a in attns)

    apply_injection(model, parse_injection("topk-random"), "decoder")
    assert observe_from_log(capsys.readouterr().err).injection_applied == "topk-random"
    assert all(a.defect.spec is DEFECTS["topk-random"] for a in attns)

    apply_injection(model, parse_injection("indexer-rope-flip"), "decoder")
    indexers = [a.indexer for a in attns if a.indexer is not None]
    assert indexers and all(i.defect.spec is DEFECTS["indexer-rope-flip"] for i in indexers)

    install(model, None)
    apply_injection(model, parse_injection("step-delay:25"), "mtp")  # the draft is not delayed
    assert not any(getattr(a, "step_delay_s", 0.0) for a in attns) and all(a.defect is CORRECT for a in attns)
    apply_injection(model, parse_injection("step-delay:25"), "decoder")
    assert [getattr(a, "step_delay_s", 0.0) for a in attns] == [0.025] + [0.0] * (len(attns) - 1)


def test_paged_attention_goes_through_the_layers_defect():
    """The CPU path reads its indexer keys, selection and softmax scale through ``attn.defect`` where the reference
    does (source check: running ``paged_dsa_attention`` needs vLLM's forward context)."""
    source = (Path(__file__).resolve().parents[1] / "dsa_route/vllm_cpu/attention.py").read_text()
    for call in ("attn.defect.index_keys(", "attn.defect.select(logits, attn.index_topk)",
                 "attn.defect.softmax_scale(attn.softmax_scale)", "time.sleep(attn.step_delay_s)"):
        assert call in source


# ---- plugin ----------------------------------------------------------------------------------------------------------
def _probe():
    from dsa_route.plugin import Probe

    return Probe("cpu", None, False, {"DeepseekV32ForCausalLM": "vllm.models.deepseek_v32:DeepseekV32ForCausalLM"},
                 lambda a, t: None, lambda m: True)


def _model(tmp_path: Path, arch: str, model_type: str) -> str:
    path = tmp_path / arch
    path.mkdir(exist_ok=True)
    (path / "config.json").write_text(json.dumps({"architectures": [arch], "model_type": model_type}))
    return str(path)


def test_plugin_line_states_the_injection_and_attestation_reads_it(tmp_path):
    from dsa_route.plugin import apply

    argv = ["vllm", "serve", _model(tmp_path, "DeepseekV32ForCausalLM", "deepseek_v32")]
    line, level = apply({ENV_INJECT: "step-delay:50"}, argv, _probe)
    assert level == logging.INFO and "inject=step-delay:50" in line.split()
    observed = observe_from_log(line)
    assert observed.injection == "step-delay:50" and observed.injection_refused is None
    line, _ = apply({}, argv, _probe)
    assert "inject" not in line and observe_from_log(line).injection is None


def test_plugin_refuses_an_injection_nothing_would_apply(tmp_path):
    from dsa_route.plugin import apply

    argv = ["vllm", "serve", _model(tmp_path, "LlamaForCausalLM", "llama")]
    line, level = apply({ENV_INJECT: "topk-random"}, argv, _probe)
    assert level == logging.WARNING and "inject_refused=topk-random" in line.split() and " inject=" not in line
    observed = observe_from_log(line)
    assert observed.injection is None and observed.injection_refused == "topk-random"
    assert "refused" in attest({"injection": "topk-random"}, observed)["mismatches"][0]


# ---- attestation -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("declared,seen,valid", [
    (None, None, True), ("topk-random", "topk-random", True), ("step-delay:50", "step-delay:50", True),
    ("topk-random", None, False),          # the candidate silently lacks its injection
    (None, "topk-random", False),          # an injection nobody declared
    ("step-delay:50", "step-delay:20", False),
])
def test_attestation_requires_the_declared_injection(declared, seen, valid):
    intended = {"route": "candidate", "injection": declared}
    observed = Observation(route="candidate", injection=seen, injection_applied=seen)
    result = attest(intended, observed)
    assert result["valid"] is valid
    assert bool(compare_paths(intended, observed)) is not valid
    if not valid:
        assert result["mismatches"] == [f"injection: declared {declared!r}, observed {seen!r}"]


def test_attestation_requires_the_model_class_to_have_applied_it(tmp_path):
    from dsa_route.plugin import apply

    argv = ["vllm", "serve", _model(tmp_path, "DeepseekV32ForCausalLM", "deepseek_v32")]
    plugin_line, _ = apply({ENV_INJECT: "topk-random"}, argv, _probe)
    applied = "(EngineCore pid=7) dsa_route.vllm_cpu: applied inject=topk-random model=DsaCpuForCausalLM layers=[0, 1]"
    intended = {"route": "auto", "injection": "topk-random"}
    only_plugin = observe_from_log(plugin_line)
    assert only_plugin.injection_applied is None
    assert "no model class applied it" in attest(intended, only_plugin)["mismatches"][0]
    both = observe_from_log(plugin_line + "\n" + applied)
    assert both.injection_applied == "topk-random" and both.dsa_route_lines == 1
    assert attest(intended, both)["valid"] is True


def test_plans_without_the_field_are_not_judged_on_it():
    assert compare_paths({"route": "baseline"}, Observation(route="baseline")) == []


# ---- scenario, plan, CLI ---------------------------------------------------------------------------------------------
def test_scenario_accepts_inject_per_arm_and_keeps_it_off_by_default():
    scenario = load_scenario("cpu-tiny-dsa", {"arms.candidate.inject": "step-delay:50"})
    assert scenario.arms["candidate"].injection() == Injection("step-delay", {"ms": 50.0})
    assert scenario.arms["baseline"].inject is None
    assert all(arm.inject is None for arm in load_scenario("cpu-tiny-dsa").arms.values())


def test_scenario_refuses_an_unknown_kind_in_one_line():
    with pytest.raises(ScenarioError) as error:
        load_scenario("cpu-tiny-dsa", {"arms.candidate.inject": "topk-inverted"})
    message = str(error.value)
    assert "arms.candidate.inject" in message and ALLOWED in message and "\n" not in message


def _plan(overrides, tmp_path, monkeypatch):
    from harness.run.plan import Machine, build_plan

    monkeypatch.setenv("DSA_BENCH_CACHE", str(tmp_path))
    scenario = load_scenario("cpu-tiny-dsa", overrides)
    machine = Machine(name="cpu", device="test cpu", cpu_count=2, gpu_count=0, has_triton=False)
    return build_plan(scenario, machine, ("/models/tiny", "/models/tiny"))


def test_plan_puts_the_injection_into_that_arms_server_env_only(tmp_path, monkeypatch):
    plan = _plan({"arms.candidate.inject": "topk-random"}, tmp_path, monkeypatch)
    baseline, candidate = plan.arms
    assert candidate.server_env[ENV_INJECT] == "topk-random" and ENV_INJECT not in baseline.server_env
    assert candidate.intended["injection"] == "topk-random" and baseline.intended["injection"] is None
    assert candidate.refusals == ()


def test_cli_plan_shows_the_injection_and_compare_refuses_bad_kinds(capsys, tmp_path, monkeypatch):
    from harness.cli import main

    monkeypatch.setenv("DSA_BENCH_CACHE", str(tmp_path))
    code = main(["plan", "--scenario", "cpu-tiny-dsa", "--concurrency", "1", "--repeats", "1",
                 "--inject-candidate", "indexer-rope-flip"])
    out, _ = capsys.readouterr()
    assert code == 0 and out.count("injected: indexer-rope-flip") == 1
    assert f"{ENV_INJECT}=indexer-rope-flip" in out
    code = main(["compare", "--out", str(tmp_path / "results"), "--inject-candidate", "slow"])
    _, err = capsys.readouterr()
    assert code == 2 and err.startswith("dsa-bench compare: error: ") and ALLOWED in err and err.count("\n") == 1
    assert not (tmp_path / "results").exists() and procs.live_children() == []


# ---- report ----------------------------------------------------------------------------------------------------------
def test_report_arm_says_injected():
    from harness.render.arms import injection_text

    from harness.rundir.schema import Injection as InjectionRecord

    assert injection_text(None) == ""
    assert injection_text(InjectionRecord(kind="topk-random")) == "topk-random"
    assert injection_text(InjectionRecord(kind="step-delay", params={"ms": 50.0})) == "step-delay ms=50"


def test_plan_refuses_an_injection_on_an_arm_dsa_route_does_not_serve(tmp_path, monkeypatch):
    from harness.run.plan import Machine, build_plan

    monkeypatch.setenv("DSA_BENCH_CACHE", str(tmp_path))
    scenario = load_scenario("cpu-tiny", {"arms.candidate.inject": "step-delay:10"})  # DeepSeek-V3: vLLM's own class
    machine = Machine(name="cpu", device="test cpu", cpu_count=2, gpu_count=0, has_triton=False)
    baseline, candidate = build_plan(scenario, machine, ("/models/tiny", "/models/tiny")).arms
    assert baseline.refusals == ()
    assert len(candidate.refusals) == 1 and "dsa_route.vllm_cpu" in candidate.refusals[0]


def test_runner_records_the_injection_and_never_inherits_one(tmp_path, monkeypatch):
    from harness.run import run_manifest, runner

    plan = _plan({"arms.candidate.inject": "step-delay:50"}, tmp_path, monkeypatch)
    baseline, candidate = plan.arms
    assert run_manifest._injection_record(candidate) == {"kind": "step-delay", "params": {"ms": 50.0}}
    assert run_manifest._injection_record(baseline) is None
    monkeypatch.setenv(ENV_INJECT, "topk-random")  # a stray variable in the user's shell must not inject anything
    self = type("R", (), {})()
    assert ENV_INJECT not in runner.Runner._server_env(self, baseline)
    assert runner.Runner._server_env(self, candidate)[ENV_INJECT] == "step-delay:50"
