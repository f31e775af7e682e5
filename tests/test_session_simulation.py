"""The session-level simulation (harness.study.session_simulation) on a slice of the real session recording
(tests/fixtures/recorded/real-sessions): structure of drawn runs and their tables, and that an injected 50 % loss
FAILs more often than A/A. The rates themselves are benchmark figures (README), never asserted here."""

from pathlib import Path

import numpy as np
import pytest

from harness.study import session_simulation as sim
from harness.judge.policy import GatePolicy, Status
from harness.rundir.store import RunDir

RECORDING = Path(__file__).parent / "fixtures" / "recorded" / "real-sessions"
POLICY = GatePolicy(primary=("output_throughput", "mean_tpot_ms"), bootstrap_resamples=100)


@pytest.fixture(scope="module")
def pool():
    store = RunDir(RECORDING)
    return sim.session_pool(store.manifest(), store.levels(numeric=True), store.requests(numeric=True),
                            max_sessions=10)


def test_pool_holds_complete_sessions_in_time_order(pool):
    assert len(pool.sessions) == 10 and pool.rounds_per_session > 1
    assert [s.started_at for s in pool.sessions] == sorted(s.started_at for s in pool.sessions)
    for session in pool.sessions:
        assert len(session.rounds) == pool.rounds_per_session
        assert set(session.levels["concurrency"]) == set(pool.concurrency)
        assert set(session.requests["round"]) == set(session.rounds)


def test_draw_run_pairs_sessions_without_replacement_in_the_runners_block_order(pool):
    run = sim.draw_run(pool, 4, np.random.default_rng(3), order="abba")
    used = [i for block in run.blocks for i in block]
    assert len(set(used)) == 8
    for j, (base, cand) in enumerate(run.blocks):
        assert (base < cand) == (j % 2 == 0)                    # ABBA: A first in even blocks
    rng = np.random.default_rng(4)
    orientations = {base < cand for _ in range(20) for base, cand in sim.draw_run(pool, 4, rng).blocks}
    assert orientations == {True, False}                    # random block order: either arm may start a block
    with pytest.raises(ValueError, match="need 12 recorded sessions"):
        sim.draw_run(pool, 6, np.random.default_rng(0))


def test_run_tables_renumber_sessions_and_rounds_per_arm_and_scale_the_candidate(pool):
    run = sim.draw_run(pool, 3, np.random.default_rng(5))
    k = pool.rounds_per_session
    manifest, levels, requests = sim.run_tables(pool, run, 2, throughput_factor=0.5)
    assert manifest.scenario_value("workload", "repeats") == 2
    for arm in ("baseline", "candidate"):
        rows = levels[levels["arm"] == arm]
        assert sorted(set(rows["session"])) == [0, 1]
        assert sorted(set(rows["round"])) == list(range(2 * k))
        assert all(rows.loc[rows["round"] == r, "session"].eq(r // k).all() for r in range(2 * k))
        assert len(manifest.arm(arm).levels) == 2 * k * len(pool.concurrency)
    base_index, cand_index = run.blocks[0]
    recorded = pool.sessions[cand_index].levels["output_throughput"].to_numpy()
    drawn = levels[(levels["arm"] == "candidate") & (levels["session"] == 0)]["output_throughput"].to_numpy()
    assert np.allclose(sorted(drawn), sorted(0.5 * recorded))
    base_requests = requests[(requests["arm"] == "baseline") & (requests["session"] == 0)]
    assert np.allclose(np.sort(base_requests["tpot_ms"].dropna().to_numpy()),
                       np.sort(pool.sessions[base_index].requests["tpot_ms"].dropna().to_numpy()))


def test_judge_first_is_the_gates_verdict_on_the_first_blocks(pool):
    run = sim.draw_run(pool, 4, np.random.default_rng(7))
    for m in (2, 4):
        verdict = sim.judge_first(pool, run, m, POLICY)
        throughput = [c for c in verdict.primary if c.metric == "output_throughput"]
        assert [c.level.concurrency for c in throughput] == list(pool.concurrency)
        assert all(c.repeats == m and not c.reasons for c in throughput)
    assert sim.judge_first(pool, run, 2, POLICY).status != Status.PASS   # below min_sessions: never a PASS


def test_a_fifty_percent_loss_fails_more_often_than_aa(pool):
    aa = sim.simulate(pool, POLICY, sessions=4, n_sims=6, seed=1)
    loss = sim.simulate(pool, POLICY, sessions=4, n_sims=6, seed=1, throughput_factor=0.5)
    assert sum(aa.counts.values()) == sum(loss.counts.values()) == 6
    assert loss.rate(Status.FAIL) > aa.rate(Status.FAIL)
    assert loss.cell_fails and all(name.startswith(("output_throughput", "mean_tpot_ms")) for name in loss.cell_fails)
    low, high = loss.interval(Status.FAIL)
    assert 0.0 <= low <= loss.rate(Status.FAIL) <= high <= 1.0


def test_noise_figures_are_finite_spreads_per_level(pool):
    rows = sim.noise(pool)
    assert [r.concurrency for r in rows] == list(pool.concurrency)
    for row in rows:
        assert row.within > 0 and row.session_means > 0 and row.between >= 0
        assert row.within_df == len(pool.sessions) * (pool.rounds_per_session - 1)
        assert row.pair_upper > row.pair > 0
    sd, df = sim.pooled_pair_spread(pool)
    assert sd > 0 and df == len(pool.sessions) // 2 - 1


def test_contiguous_draws_take_consecutive_sessions(pool):
    run = sim.draw_run(pool, 3, np.random.default_rng(11), contiguous=True, order="abba")
    used = sorted(i for block in run.blocks for i in block)
    assert used == list(range(used[0], used[0] + 6))
    assert all((base < cand) == (j % 2 == 0) for j, (base, cand) in enumerate(run.blocks))
