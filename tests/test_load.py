"""Parsing vLLM's own `vllm bench serve --save-detailed` JSON (captured from a real run) into the two CSVs."""

import json
from pathlib import Path

import pytest

from harness.rundir import schema
from harness.rundir import store as records
from harness.run.load import parse_bench_result, read_bench_json

C4 = schema.Level("random", 64, 32, 4)

FIXTURE = Path(__file__).parent / "fixtures" / "bench" / "vllm-bench-serve-c4.json"


@pytest.fixture(scope="module")
def bench():
    return read_bench_json(FIXTURE)


def test_level_row_carries_vllms_aggregates(bench):
    level, _ = parse_bench_result(bench, "baseline", C4, 0)
    assert set(schema.REQUIRED_LEVEL_COLUMNS) | {"session", "output_throughput", "mean_tpot_ms"} <= set(level)
    assert level["completed"] == bench["completed"] and level["output_throughput"] == bench["output_throughput"]
    assert level["mean_tpot_ms"] == pytest.approx(bench["mean_tpot_ms"])
    assert level["p99_ttft_ms"] == pytest.approx(bench["p99_ttft_ms"])


def test_request_rows_use_server_counted_tokens(bench):
    _, rows = parse_bench_result(bench, "candidate", C4, 1)
    assert len(rows) == len(bench["input_lens"])
    for row, out_len, ttft, e2el in zip(rows, bench["output_lens"], bench["ttfts"], bench["latencies"]):
        assert row["output_len"] == out_len and row["arm"] == "candidate" and row["round"] == 1
        assert row["tpot_ms"] == pytest.approx((e2el - ttft) * 1000 / (out_len - 1))
    # vLLM's mean TPOT is the mean of the same per-request figures.
    assert sum(r["tpot_ms"] for r in rows) / len(rows) == pytest.approx(bench["mean_tpot_ms"], rel=1e-6)
    assert min(r["start_s"] for r in rows) == 0.0


def test_rows_round_trip_through_the_csvs(tmp_path, bench):
    level, rows = parse_bench_result(bench, "baseline", C4, 0)
    store = records.RunDir(tmp_path)
    store.append_levels([level])
    store.append_levels([dict(level, arm="candidate")])
    store.append_requests(rows)
    levels = store.levels(numeric=True)
    assert list(levels["arm"]) == ["baseline", "candidate"] and set(levels["level"]) == {str(C4)}
    frame = store.requests()
    assert len(frame) == len(rows) and frame["tpot_ms"].notna().all()


def test_failed_requests_have_no_latency(bench):
    broken = dict(bench)
    broken["errors"] = ["Traceback ...\nServerDisconnectedError"] + list(bench["errors"][1:])
    _, rows = parse_bench_result(broken, "baseline", C4, 0)
    assert rows[0]["error"] == "ServerDisconnectedError" and rows[0]["tpot_ms"] is None


@pytest.mark.parametrize("mutate,match", [
    (lambda d: d.pop("ttfts"), "lacks"),
    (lambda d: d.__setitem__("ttfts", d["ttfts"][:-1]), "entries"),
])
def test_corrupted_json_is_a_clear_error(bench, mutate, match):
    data = json.loads(json.dumps(bench))
    mutate(data)
    with pytest.raises(ValueError, match=match):
        parse_bench_result(data, "baseline", C4, 0)


def test_unreadable_file_names_itself(tmp_path):
    path = tmp_path / "x.json"
    path.write_text("{not json")
    with pytest.raises(ValueError, match=str(path)):
        read_bench_json(path)


def test_corrupted_levels_csv_is_a_run_dir_error(tmp_path):
    (tmp_path / schema.LEVELS).write_text("arm,concurrency\n\"unterminated\n")
    with pytest.raises(records.RunDirError):
        records.RunDir(tmp_path).levels()


def test_each_latency_metric_name_means_one_thing(bench):
    """The registry's request statistics, computed from requests.csv rows as the gate does, are vLLM's level columns of
    the same name (vllm/benchmarks/serve.py): one meaning per metric name."""
    import numpy as np

    from harness.metrics import METRICS, REPORT_TABLE

    level, rows = parse_bench_result(bench, "baseline", C4, 0)
    assert set(REPORT_TABLE) <= set(schema.LEVEL_COLUMNS)
    checked = 0
    for metric in METRICS.values():
        if metric.source != "request" or metric.name not in level:
            continue
        values = np.array([r[metric.column] for r in rows if r[metric.column] is not None], dtype=float)
        ours = {"mean": values.mean(), "median": np.median(values), "p99": np.percentile(values, 99)}[metric.statistic]
        assert ours == pytest.approx(level[metric.name], rel=1e-6), metric.name
        checked += 1
    assert checked == 9   # mean, median and p99 of TTFT, TPOT and E2EL


def test_max_itl_is_the_largest_streamed_gap_per_request(bench):
    _, rows = parse_bench_result(bench, "baseline", C4, 0)
    for row, gaps in zip(rows, bench["itls"]):
        assert row["max_itl_ms"] == pytest.approx(1000 * max(gaps))


def test_whole_output_in_the_first_chunk_has_no_gap_and_is_coalesced(bench):
    """A recorded request made into a burst (every later chunk 0.01 ms apart, TTFT unchanged): only its max ITL
    shows it, and the coalesced-stream rule counts it."""
    from harness.judge.validity import coalesced_share
    import pandas as pd

    data = json.loads(json.dumps(bench))
    data["itls"][0] = [1e-5] * len(data["itls"][0])
    data["itls"][1] = []
    data["errors"][2] = "boom"
    _, rows = parse_bench_result(data, "baseline", C4, 0)
    assert rows[0]["max_itl_ms"] == pytest.approx(0.01) and rows[1]["max_itl_ms"] == 0.0
    assert rows[2]["max_itl_ms"] is None
    assert rows[0]["ttft_ms"] < 0.95 * rows[0]["e2el_ms"]          # TTFT alone would not see it
    coalesced, checked = coalesced_share(pd.DataFrame(rows))
    assert (coalesced, checked) == (2, len(rows) - 1)


def test_results_without_itls_leave_max_itl_empty(bench):
    data = {k: v for k, v in bench.items() if k != "itls"}
    _, rows = parse_bench_result(data, "baseline", C4, 0)
    assert all(row["max_itl_ms"] is None for row in rows)


def test_goodput_and_slo_attainment_are_vllms_own_goodput(bench):
    """``--goodput`` (the scenario's ``[slo]``): vLLM's ``request_goodput`` is kept and the attainment is its good
    requests (goodput × duration) over the completed ones; without it both stay empty."""
    level, _ = parse_bench_result(bench, "baseline", C4, 0)
    assert level["request_goodput"] is None and level["slo_attainment"] is None
    good = bench["completed"] - 3
    slowed = {**bench, "request_goodput": good / bench["duration"]}
    level, _ = parse_bench_result(slowed, "baseline", C4, 0)
    assert level["request_goodput"] == pytest.approx(good / bench["duration"])
    assert level["slo_attainment"] == pytest.approx(good / bench["completed"])
