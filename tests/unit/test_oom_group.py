"""The real node ends a container whole after an OOM kill, as cgroup v2's memory.oom.group
does (testbed/grpo_testbed/node/oom_group.py): what it reads from cgroup v1's files.
The kill itself, on a real pod: tests/e2e/test_real_node.py."""

from __future__ import annotations

from grpo_testbed.node.oom_group import memory_cgroup, newly_killed, oom_kills

# memory.oom_control of a cgroup v1 container after one kill (Linux >= 4.13).
AFTER_ONE_KILL = "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n"


def test_the_kill_count_is_read_from_memory_oom_control() -> None:
    assert oom_kills(AFTER_ONE_KILL) == 1
    assert oom_kills("oom_kill_disable 0\nunder_oom 0\noom_kill 0\n") == 0
    assert oom_kills("oom_kill_disable 0\nunder_oom 0\n") == 0  # a kernel before 4.13


def test_only_containers_whose_count_rose_are_ended() -> None:
    before = {"a": 0, "b": 1, "c": 0}
    assert newly_killed(before, {"a": 0, "b": 1, "c": 2}) == ["c"]
    # A container first seen after its kill (it started and hit its limit in between).
    assert newly_killed(before, {"a": 0, "new": 1}) == ["new"]
    assert newly_killed(before, {"a": 0, "fresh": 0}) == []


def test_the_memory_cgroup_is_found_among_a_processes_cgroups() -> None:
    proc = ("9:name=systemd:/\n8:pids:/\n4:memory:/k8s.io/5d99ef\n"
            "2:cpu,cpuacct:/k8s.io/5d99ef\n0::/\n")
    assert memory_cgroup(proc) == "/k8s.io/5d99ef"
    assert memory_cgroup("0::/k8s.io/5d99ef\n") is None  # cgroup v2 only: nothing to do
