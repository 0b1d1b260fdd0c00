"""Host memory: the reserve rule, probing (psutil, cgroup, /proc), file-backed tensors, rounding."""

from __future__ import annotations

import json

import pytest
import torch

from offload_lab.planning import hostmem
from offload_lab.planning.hostmem import (
    HostMemory,
    HostMemoryError,
    cgroup_memory,
    file_backed_checker,
    is_file_backed,
    process_memory,
    resolve_host,
    rounded_size,
)
from offload_lab.units import SizeError

GiB = 2**30
MiB = 2**20


# -- the reserve rule ---------------------------------------------------------------------------
def test_reserve_is_two_gib_floor_on_small_hosts():
    host = HostMemory(available="8GiB")
    assert host.reserve == 2 * GiB
    assert host.spendable == 6 * GiB


def test_reserve_is_five_percent_on_large_hosts():
    host = HostMemory(available="100GiB")
    assert host.reserve == 5 * GiB
    assert host.spendable == 95 * GiB


def test_already_pinned_bytes_are_not_spendable_again():
    host = HostMemory(available="10GiB", pinned_bytes="3GiB")
    assert host.spendable == 10 * GiB - 2 * GiB - 3 * GiB


def test_spendable_never_negative_but_headroom_says_how_far_over():
    host = HostMemory(available="1GiB")
    assert host.spendable == 0
    assert host.headroom == -1 * GiB


def test_sizes_accept_strings_ints_and_floats():
    host = HostMemory(available="32GiB", total=64 * GiB, anon_bytes=1.5e9, pinned_bytes="512MiB")
    assert (host.available, host.total, host.anon_bytes, host.pinned_bytes) == (
        32 * GiB, 64 * GiB, 1_500_000_000, 512 * MiB)


@pytest.mark.parametrize("bad, words", [
    ("-3GiB", ["'-3GiB'", "not a size"]),
    ("lots", ["'lots'", "not a size"]),
    ("8", ["'8'", "ambiguous", "8GiB"]),
    (-5, ["-5", "negative"]),
    ("8 parsecs", ["unknown unit", "GiB"]),
])
def test_bad_sizes_name_the_value_and_what_is_accepted(bad, words):
    with pytest.raises(SizeError) as e:
        HostMemory(available=bad)
    msg = str(e.value)
    assert "available" in msg
    for w in words:
        assert w in msg


def test_total_below_available_is_refused():
    with pytest.raises(HostMemoryError, match=r"total 4.00 GiB is less than available 8.00 GiB"):
        HostMemory(available="8GiB", total="4GiB")


def test_to_dict_round_trips_through_json():
    host = HostMemory(available="43GiB", total="60GB", cgroup_limit="50GiB", anon_bytes=7,
                      pinned_bytes="1GiB", source="probe")
    d = json.loads(json.dumps(host.to_dict()))
    assert d["reserve"] == host.reserve and d["spendable"] == host.spendable
    back = HostMemory.from_dict(d)
    assert back == host


def test_from_dict_refuses_what_is_not_a_host():
    with pytest.raises(HostMemoryError, match="no 'available'"):
        HostMemory.from_dict({"total": 5})


def test_repr_is_readable():
    r = repr(HostMemory(available="64GiB"))
    assert "available=64.00 GiB" in r and "reserve=3.20 GiB" in r and "spendable=60.80 GiB" in r


# -- probing ------------------------------------------------------------------------------------
def test_probe_measures_this_machine():
    import psutil

    host = HostMemory.probe()
    assert host.source == "probe"
    assert 0 < host.available <= psutil.virtual_memory().total
    assert host.total >= host.available
    assert host.anon_bytes >= 0 and host.file_bytes >= 0


def test_probe_takes_the_cgroup_limit_when_it_is_tighter(monkeypatch):
    monkeypatch.setattr(hostmem, "cgroup_memory", lambda: (4 * GiB, 1 * GiB))
    host = HostMemory.probe(pinned_bytes="256MiB")
    assert host.available == 1 * GiB
    assert host.cgroup_limit == 4 * GiB
    assert host.pinned_bytes == 256 * MiB


def _cgroup_tree(tmp_path, files: dict[str, str], proc: str = "0::/\n"):
    for rel, text in files.items():
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    proc_path = tmp_path / "proc_cgroup"
    proc_path.write_text(proc)
    return tmp_path, proc_path


def test_cgroup_v2_limit_minus_usage(tmp_path):
    root, proc = _cgroup_tree(tmp_path, {"memory.max": "8589934592\n", "memory.current": "2147483648\n"})
    assert cgroup_memory(root, proc) == (8 * GiB, 6 * GiB)


def test_cgroup_v2_unlimited_is_none(tmp_path):
    root, proc = _cgroup_tree(tmp_path, {"memory.max": "max\n", "memory.current": "2147483648\n"})
    assert cgroup_memory(root, proc) == (None, None)


def test_cgroup_v2_drops_inactive_file_cache_from_usage(tmp_path):
    root, proc = _cgroup_tree(tmp_path, {
        "memory.max": str(8 * GiB), "memory.current": str(5 * GiB),
        "memory.stat": f"anon 123\ninactive_file {2 * GiB}\nactive_file 7\n",
    })
    assert cgroup_memory(root, proc) == (8 * GiB, 5 * GiB)


def test_cgroup_v2_tightest_ancestor_wins(tmp_path):
    root, proc = _cgroup_tree(tmp_path, {
        "memory.max": "max",
        "kube/memory.max": str(4 * GiB), "kube/memory.current": str(3 * GiB),
        "kube/pod/memory.max": str(16 * GiB), "kube/pod/memory.current": str(1 * GiB),
    }, proc="0::/kube/pod\n")
    assert cgroup_memory(root, proc) == (4 * GiB, 1 * GiB)


def test_cgroup_v1_limit_minus_usage_and_unlimited(tmp_path):
    root, proc = _cgroup_tree(tmp_path, {
        "memory/memory.limit_in_bytes": str(6 * GiB),
        "memory/memory.usage_in_bytes": str(2 * GiB),
    }, proc="4:memory:/\n")
    assert cgroup_memory(root, proc) == (6 * GiB, 4 * GiB)
    (root / "memory/memory.limit_in_bytes").write_text("9223372036854771712")
    assert cgroup_memory(root, proc) == (None, None)


def test_no_cgroup_filesystem_is_not_an_error(tmp_path):
    assert cgroup_memory(tmp_path / "none", tmp_path / "none_proc") == (None, None)


def test_process_memory_reads_proc_status(tmp_path):
    status = tmp_path / "status"
    status.write_text("Name:\tpython\nVmLck:\t       8 kB\nRssAnon:\t  1024 kB\n"
                      "RssFile:\t   2048 kB\nRssShmem:\t  4 kB\n")
    assert process_memory(status) == {"anon_bytes": 1024 * 1024, "file_bytes": 2048 * 1024,
                                      "shmem_bytes": 4096, "locked_bytes": 8192}


def test_process_memory_is_zero_where_proc_is_absent(tmp_path):
    assert process_memory(tmp_path / "missing") == dict.fromkeys(
        ["anon_bytes", "file_bytes", "shmem_bytes", "locked_bytes"], 0)


def test_process_memory_of_this_process_has_anonymous_bytes():
    mem = process_memory()
    assert set(mem) == {"anon_bytes", "file_bytes", "shmem_bytes", "locked_bytes"}
    if hostmem.Path("/proc/self/status").exists():
        assert mem["anon_bytes"] > 0


# -- file-backed tensors --------------------------------------------------------------------------
needs_proc = pytest.mark.skipif(not hostmem.Path("/proc/self/maps").exists(),
                                reason="needs /proc/self/maps to tell a mapping from anonymous memory")


@needs_proc
def test_a_view_of_a_mapped_file_is_file_backed(tmp_path):
    path = tmp_path / "weights.bin"
    path.write_bytes(b"\0" * (1 << 16))
    t = torch.from_file(str(path), shared=True, size=1 << 14, dtype=torch.float32)
    assert is_file_backed(t)
    assert is_file_backed(t[100:200])
    assert not is_file_backed(t.clone())


def test_anonymous_meta_and_empty_tensors_are_not_file_backed():
    assert not is_file_backed(torch.zeros(1024))
    assert not is_file_backed(torch.empty(0))
    assert not is_file_backed(torch.empty(8, device="meta"))
    assert not is_file_backed("not a tensor")


def test_checker_is_false_where_maps_is_absent(tmp_path):
    check = file_backed_checker(tmp_path / "no_maps")
    assert check(torch.zeros(3)) is False


def test_checker_ignores_memfd_and_anonymous_lines(tmp_path):
    t = torch.zeros(256)
    lo, hi = t.data_ptr() - 4096, t.data_ptr() + 4096 * 4
    maps = tmp_path / "maps"
    line = f"{lo:x}-{hi:x} rw-s 00000000 00:01 1234 "
    maps.write_text(line + "/memfd:weights (deleted)\n")
    assert file_backed_checker(maps)(t) is False
    maps.write_text(f"{lo:x}-{hi:x} rw-p 00000000 00:00 0 \n")
    assert file_backed_checker(maps)(t) is False
    maps.write_text(line + "/data/model.safetensors\n")
    assert file_backed_checker(maps)(t) is True


# -- what is really locked -----------------------------------------------------------------------
def test_rounded_size_exact_and_pow2():
    assert rounded_size(1_291_143_680) == 1_291_143_680
    assert rounded_size(1_291_143_680, "pow2") == 2 * GiB
    assert rounded_size(GiB, "pow2") == GiB
    assert rounded_size(0, "pow2") == 0
    with pytest.raises(HostMemoryError, match=r"rounding 'up' is not one of \['exact', 'pow2'\]"):
        rounded_size(5, "up")
    with pytest.raises(HostMemoryError, match="-5 is negative"):
        rounded_size(-5)


def test_pow2_rounding_shows_how_a_caching_allocator_overcommits():
    # 34 MiniMax-H3 blocks of 1.20 GiB: 40.9 GiB exactly, 68 GiB when each is rounded up
    block = 1_291_143_680
    exact = sum(rounded_size(block) for _ in range(34))
    pow2 = sum(rounded_size(block, "pow2") for _ in range(34))
    assert exact < 41 * GiB < 68 * GiB == pow2


# -- one reading of host= -------------------------------------------------------------------------
def test_resolve_host_reads_every_accepted_form():
    given = HostMemory(available="8GiB")
    assert resolve_host(given) is given
    assert resolve_host("64GiB").available == 64 * GiB
    assert resolve_host(given.to_dict()).available == 8 * GiB
    assert resolve_host(None).source == "probe"
    assert resolve_host(None, probe=False) is None
    with pytest.raises(HostMemoryError, match=r"host \[1\] is not a HostMemory"):
        resolve_host([1])


# -- sizes too large to be hosts ---------------------------------------------------------------------
@pytest.mark.parametrize("size", ["1e400", "1e308GiB", 1e400, "1e19", 2**70])
def test_huge_sizes_are_one_line_size_errors(size):
    with pytest.raises(SizeError, match="too large|not finite") as e:
        HostMemory(available=size)
    assert "\n" not in str(e.value)
