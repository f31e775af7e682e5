"""Host steal time and load average per level: the pure parsers of /proc/stat and /proc/loadavg on fixture text,
and the steal check of the gate's validity (a level measured under heavy steal is INVALID)."""

import pytest

from harness.run.host_load import CpuTimes, parse_loadavg, parse_proc_stat, steal_share

# The first lines of a KVM guest's /proc/stat (proc(5) order: user nice system idle iowait irq softirq steal guest
# guest_nice), two readings 10 s apart on 2 vCPUs (2000 ticks at USER_HZ 100).
STAT_BEFORE = """cpu  74608 2520 24433 1117073 6176 4054 0 1200 0 0
cpu0 37784 1307 12139 558316 3150 2009 0 600 0 0
cpu1 36824 1213 12294 558757 3026 2045 0 600 0 0
intr 1462898 31 0 0
ctxt 5084616
"""
STAT_AFTER = """cpu  75408 2520 24733 1117573 6176 4054 0 1500 0 0
cpu0 38184 1307 12289 558566 3150 2009 0 750 0 0
cpu1 37224 1213 12444 559007 3026 2045 0 750 0 0
intr 1463898 31 0 0
"""


def test_cpu_line_sums_the_eight_time_fields_and_takes_steal():
    times = parse_proc_stat(STAT_BEFORE)
    assert times == CpuTimes(steal=1200, total=74608 + 2520 + 24433 + 1117073 + 6176 + 4054 + 0 + 1200)


def test_guest_time_is_not_counted_twice():
    """guest and guest_nice are already inside user and nice (proc(5))."""
    with_guest = parse_proc_stat("cpu  100 0 0 100 0 0 0 0 50 5\n")
    assert with_guest.total == 200


def test_steal_share_over_the_window():
    share = steal_share(parse_proc_stat(STAT_BEFORE), parse_proc_stat(STAT_AFTER))
    assert share == pytest.approx(300 / (800 + 300 + 500 + 300))


def test_old_kernel_without_steal_reads_zero():
    assert parse_proc_stat("cpu  10 20 30 40\n") == CpuTimes(steal=0, total=100)


@pytest.mark.parametrize("before, after", [(None, CpuTimes(1, 10)), (CpuTimes(1, 10), None),
                                           (CpuTimes(1, 10), CpuTimes(1, 10))])
def test_no_share_without_two_readings_or_ticks(before, after):
    assert steal_share(before, after) is None


@pytest.mark.parametrize("text", ["intr 1 2 3\n", "cpu  a b c d\n", "cpu  1 2\n"])
def test_bad_proc_stat_is_a_clear_error(text):
    with pytest.raises(ValueError, match="/proc/stat"):
        parse_proc_stat(text)


def test_loadavg_one_minute():
    assert parse_loadavg("1.52 0.98 0.61 3/412 12345\n") == 1.52
    with pytest.raises(ValueError, match="/proc/loadavg"):
        parse_loadavg("")


@pytest.mark.parametrize("before,after,tokens,expected", [
    (10.0, 10.5, 250, 2.0), (10.0, 10.5, "250", 2.0), (None, 10.5, 250, None), (10.0, None, 250, None),
    (10.0, 10.5, 0, None), (10.0, 10.5, None, None), (10.5, 10.0, 250, None),
])
def test_engine_cpu_per_token(before, after, tokens, expected):
    from harness.run.host_load import cpu_ms_per_token

    assert cpu_ms_per_token(before, after, tokens) == expected


ENGINE = """
import setproctitle, subprocess, sys, time
setproctitle.setproctitle("VLLM::EngineCore")
worker = subprocess.Popen([sys.executable, "-c", "import time\\nend = time.process_time() + 0.6\\n"
                           "while time.process_time() < end: pass\\ntime.sleep(60)"])
end = time.process_time() + 0.3
while time.process_time() < end:
    pass
print("ready", flush=True)
time.sleep(60)
"""


def test_engine_cpu_seconds_reads_the_engine_and_its_worker_not_the_api_server():
    """A stand-in server tree: an API-server process (this test's child) busy for 1 s, under it a process titled
    ``VLLM::EngineCore`` (as vLLM names it) busy for 0.3 s with a worker busy for 0.6 s."""
    import subprocess
    import sys
    import time

    from harness.run import procs

    server = subprocess.Popen([sys.executable, "-c", f"import subprocess, sys, time\n"
                               f"engine = subprocess.Popen([sys.executable, '-c', {ENGINE!r}])\n"
                               "end = time.process_time() + 1.0\nwhile time.process_time() < end: pass\n"
                               "print('api ready', flush=True)\ntime.sleep(60)"], stdout=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        seconds = None
        while time.monotonic() < deadline:
            seconds = procs.engine_cpu_seconds(server.pid)
            if seconds is not None and seconds >= 0.85:
                break
            time.sleep(0.2)
        assert seconds is not None and 0.85 <= seconds < 1.6          # engine 0.3 + worker 0.6, not the API's 1.0
    finally:
        for member in reversed(procs._tree(server.pid)):
            member.kill()
        server.wait()
    assert procs.engine_cpu_seconds(server.pid) is None             # gone: no reading
