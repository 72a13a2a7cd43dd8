"""The engine, snapshot and gateway benches run in quick mode and print their tables.

Nothing here asserts a time: the machine is shared, so the benches compare against a
baseline in the same run and print the result; these tests keep them working and check
the shape and the invariants of what they print.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def bench_tmp(tmp_path: Path) -> dict[str, str]:
    """The bench's scratch files (its sqlite stores, ...) in the test's own folder: removed
    after it, and on tmpfs when tests/conftest.py found one (no time is asserted here)."""
    return {**os.environ, "TMPDIR": str(tmp_path)}


def _bench(env: dict[str, str], *args: str) -> str:
    out = subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.mark.slow
def test_bench_engine_prints_every_row_against_both_baselines(bench_tmp):
    out = _bench(bench_tmp, "bench/bench_engine.py", "--runs", "2")
    rows = re.findall(r"^(loan \(full review\)|chain50 @ 1000 keys)\s+(activity|stop|stop, no compress)\s+(\d+)"
                      r"\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)\s+(-?[0-9.]+)\s+([0-9.]+)\s+([0-9.]+)$", out, re.M)
    assert len(rows) == 6, out
    for workload, save, acts, plain, saved, layerflow, per_act, ratio, ratio_saved in rows:
        # the loan demo's full review runs six activities; the chain fifty
        assert int(acts) == (6 if workload.startswith("loan") else 50)
        assert float(ratio) == pytest.approx(float(layerflow) / float(plain), rel=0.02, abs=0.01)
        assert float(ratio_saved) == pytest.approx(float(layerflow) / float(saved), rel=0.02, abs=0.01)
        assert float(per_act) == pytest.approx((float(layerflow) - float(plain)) / int(acts), rel=0.02, abs=0.002)
    assert "target: < 1 ms overhead per activity" in out
    # the larger runs: a long loop and a multi-instance activity, against both baselines
    larger = re.findall(r"^(loop, \d+ passes|multi-instance, \d+ items|sub-process loop, \d+ passes)\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)"
                        r"\s+([0-9.]+)\s+([0-9.]+)$", out, re.M)
    assert [name for name, *_ in larger] == ["loop, 100 passes", "multi-instance, 50 items",
                                                "sub-process loop, 20 passes"], out
    for _, plain, saved, layerflow, ratio, ratio_saved in larger:
        assert float(ratio) == pytest.approx(float(layerflow) / float(plain), rel=0.02, abs=0.01)
        assert float(ratio_saved) == pytest.approx(float(layerflow) / float(saved), rel=0.02, abs=0.01)
    # the breakdown accounts for the whole run, for both workloads
    assert out.count("ms per run by phase") == 2
    assert out.count("compression hook") == 2 and out.count("save: store") == 2


@pytest.mark.slow
def test_bench_ab_prints_each_round_of_both_checkouts_and_the_ratio(bench_tmp):
    """This checkout against itself, one round: a row per process, A first, then the medians and B / A."""
    out = _bench(bench_tmp, "bench/bench_ab.py", str(ROOT), "--rounds", "1", "--runs", "2")
    number = r"\s+([0-9.]+)"
    rows = re.findall(rf"^\s+1\s+(A|B){number * 4}\s+([0-9.]+) ([0-9.]+) ([0-9.]+)$", out, re.M)
    assert [r[0] for r in rows] == ["A", "B"], out
    for _, plain, activity, stop, stop_nc, *ratios in rows:
        for ms, ratio in zip((activity, stop, stop_nc), ratios):
            assert float(ratio) == pytest.approx(float(ms) / float(plain), rel=0.02, abs=0.01)
    assert "(cpu time)" in out and re.search(rf"^\s+B/A{number * 4}\s+\(of the medians over rounds\)$", out, re.M), out


@pytest.mark.slow
def test_bench_gateways_quick(bench_tmp):
    out = _bench(bench_tmp, "bench/bench_gateways.py", "--quick")
    assert re.search(r"join at 100,000 keys / at 1,000 keys: [0-9.]+x \(target <= 5x: (met|NOT met)\)", out), out


@pytest.mark.slow
def test_bench_snapshot_quick(bench_tmp):
    out = _bench(bench_tmp, "bench/bench_snapshot.py", "--quick")
    assert re.search(r"speed-up over deepcopy at 100,000 keys: [0-9,]+x", out), out


@pytest.mark.slow
def test_bench_confirmations_quick(bench_tmp):
    out = _bench(bench_tmp, "bench/bench_confirmations.py", "--quick")
    rows = re.findall(r"^(baseline: rebuild every unfinished instance|record heads, [a-z ]+?)\s+([0-9.]+)\s+([0-9.]+)$",
                      out, re.M)
    assert [r[0] for r in rows] == ["baseline: rebuild every unfinished instance", "record heads, first listing",
                                    "record heads, nothing changed", "record heads, one instance answered"], out
    assert float(rows[0][2]) == 1.0


@pytest.mark.slow
def test_bench_store_quick_compares_the_timer_index_with_the_full_scan(bench_tmp):
    from stores.conftest import redis_or_skip

    redis_or_skip()
    out = _bench(bench_tmp, "bench/bench_store.py", "--quick", "--backends", "sqlite,redis", "--no-workers")
    # the operations table (tests/stores/test_open_store.py runs the memory backend)
    ops = re.findall(r"^\| (sqlite|redis) \| [0-9.]+ \| [0-9.]+ \| [0-9,]+ \| [0-9,]+ \|$", out, re.M)
    assert ops == ["sqlite", "redis"], out
    assert "over 500 instances waiting for a timer, 5 due" in out, out
    rows = re.findall(r"^\| (sqlite|redis) \| (first call|next call) \| ([0-9.,]+) \| ([0-9,]+) \| ([0-9.,]+) \| "
                      r"([0-9,]+) \| ([0-9,]+)x \|$", out, re.M)
    assert [(r[0], r[1]) for r in rows] == [("sqlite", "first call"), ("sqlite", "next call"),
                                           ("redis", "first call"), ("redis", "next call")], out
    for backend, call, _scan_ms, scan_heads, _index_ms, index_heads, _faster in rows:
        # the scan reads every waiting instance's head on a first call, the index only the due ones;
        # a next call with nothing changed reads none either way
        assert (int(scan_heads.replace(",", "")), int(index_heads)) == ((500, 5) if call == "first call" else (0, 0))
    filled = re.findall(r"^\| (sqlite|redis) \| first call, index to fill \| \| \| [0-9.,]+ \| 5 \| \|$", out, re.M)
    assert filled == ["sqlite", "redis"], out
    # the agent loop's tape: bytes (not times) are deterministic. Stored whole they grow with the
    # square of the passes (100 -> 300: ~9x); in parts with the passes (~3x, a hash per level more)
    tape = re.findall(r"^\| (sqlite|redis) \| ([0-9,]+) \| [0-9.,]+ \| ([0-9,]+) \| ([0-9,]+) \| [0-9.,]+ \|"
                      r"( [0-9.,]+ \|){4}$", out, re.M)
    assert [(r[0], r[1]) for r in tape] == [(b, p) for b in ("sqlite", "redis") for p in ("30", "100", "300")], out
    for b in ("sqlite", "redis"):
        (_, whole_100, parts_100), (_, whole_300, parts_300) = [
            (p, int(w.replace(",", "")), int(q.replace(",", ""))) for n, p, w, q, _ in tape if n == b][1:]
        assert whole_300 > 6 * whole_100 and parts_300 < 4 * parts_100, tape
        assert parts_300 < whole_300 / 3, tape


@pytest.mark.slow
def test_bench_scale_quick(bench_tmp):
    out = _bench(bench_tmp, "bench/bench_scale.py", "--quick")
    voters = re.findall(r"^voters\s+(\d+): one resume answers all in\s+[0-9.]+ s$", out, re.M)
    loops = re.findall(r"^loop\s+(\d+): save=(\w+)\s+[0-9.]+ s$", out, re.M)
    assert voters == ["50", "100"] and loops == [("100", "activity"), ("100", "stop")], out
