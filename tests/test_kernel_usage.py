"""JupyterLab's Kernel Usage panel and `%usage` show the sandbox, not the kernel process.

Through jupyter_client: `usage_request` on the control channel, as jupyter-resource-usage's panel sends
it, while a process in the box holds 200 MB; and the pure reply maker with the box's figures, odd ones
included (the box's word is shown, never trusted as a number of any size or type).
"""

from __future__ import annotations

import pytest

from owsandbox.kernel.usage import UsageMeter, cell_usage

from .kernel_session import KernelSession

MB = 1 << 20


@pytest.mark.unit
def test_the_reply_has_ipykernels_fields_with_the_boxs_figures_against_its_limits():
    meter = UsageMeter()
    first = meter.reply({"memory_bytes": 300 * MB, "cpu_seconds": 10.0, "processes": 4, "cpus": 2}, 100.0, "bwrap",
                        1024 * MB, None)
    assert first["kernel_memory"] == 300 * MB and first["kernel_cpu"] == 0.0 and first["cpu_count"] == 2
    assert first["host_virtual_memory"]["total"] == 1024 * MB
    assert first["host_virtual_memory"]["available"] == 724 * MB and first["host_virtual_memory"]["percent"] == 29.3
    assert first["sandbox"] == {"provider": "bwrap", "memory_bytes": 300 * MB, "memory_limit": 1024 * MB,
                                "cpu_seconds": 10.0, "cpu_limit": None, "processes": 4}
    second = meter.reply({"memory_bytes": 300 * MB, "cpu_seconds": 11.5, "processes": 4, "cpus": 2}, 102.0,
                         "bwrap", 1024 * MB, 0.5)
    assert second["kernel_cpu"] == 75.0 and second["host_cpu_percent"] == 150.0 and second["cpu_count"] == 1


@pytest.mark.unit
@pytest.mark.parametrize("said", [{"memory_bytes": -1, "cpu_seconds": float("nan"), "processes": "many"},
                                  {"memory_bytes": True, "cpu_seconds": -5, "cpus": 1 << 70}, {}])
def test_what_the_box_says_that_is_not_a_count_counts_as_nothing(said):
    reply = UsageMeter().reply(said, 1.0, "local", None, None)
    assert reply["kernel_memory"] == 0 and reply["sandbox"]["cpu_seconds"] == 0.0
    assert reply["sandbox"]["processes"] == 0 and reply["cpu_count"] >= 1


def _usage(kernel: KernelSession) -> dict:
    reply = kernel.control("usage_request", {})
    assert reply["msg_type"] == "usage_reply", reply
    return reply["content"]


def test_the_kernel_usage_panel_sees_the_memory_a_command_in_the_box_holds(fresh_kernel: KernelSession):
    kernel = fresh_kernel
    assert kernel.run("echo up").status == "ok"  # the sandbox runs
    before = _usage(kernel)
    assert {"kernel_cpu", "kernel_memory", "host_cpu_percent", "cpu_count", "host_virtual_memory"} <= set(before)
    assert before["sandbox"]["provider"] == "local" and before["sandbox"]["processes"] >= 2  # daemon and shell
    held = kernel.run("python3 -c \"import sys, time; b = b'x' * (200 << 20); print('held', flush=True); "
                      "sys.stdin.read()\" < <(sleep 60) > held.txt & "
                      "until [ -s held.txt ]; do sleep 0.05; done; cat held.txt")
    assert held.text() == "held\n", held.outputs
    during = _usage(kernel)
    assert during["kernel_memory"] >= 200 * MB > before["kernel_memory"], (before["kernel_memory"],
                                                                           during["kernel_memory"])
    shown = kernel.run("%usage").of_type("display_data")[0]["data"]["text/plain"]
    assert shown.startswith("Memory") and "MiB" in shown and "Processes" in shown and "Sandbox    local" in shown
    kernel.run("kill %1; wait")
    after = _usage(kernel)
    assert after["kernel_memory"] < 200 * MB


@pytest.mark.unit
@pytest.mark.parametrize(("said", "kept"), [
    ({"peak_memory_bytes": 5 * MB, "cpu_seconds": 1.25, "samples": 3}, {"peak_memory_bytes": 5 * MB,
                                                                        "cpu_seconds": 1.25}),
    ({"peak_memory_bytes": 5 * MB, "cpu_seconds": None}, {"peak_memory_bytes": 5 * MB, "cpu_seconds": None}),
    ({"peak_memory_bytes": 5 * MB, "cpu_seconds": float("inf")}, {"peak_memory_bytes": 5 * MB, "cpu_seconds": None}),
    ({"peak_memory_bytes": -1, "cpu_seconds": 1.0}, None), ({"peak_memory_bytes": True}, None),
    ({"peak_memory_bytes": 1 << 70}, None), ("lots", None), (None, None)])
def test_a_commands_figures_from_the_box_are_kept_only_as_counts(said, kept):
    assert cell_usage(said) == kept


def _cell_usage(run) -> dict:
    return run.reply["metadata"]["owsandbox"]["usage"]


@pytest.mark.parametrize("kind", ["fresh_kernel", "default_kernel"])  # the local provider, bubblewrap
def test_each_execute_reply_carries_the_peak_memory_and_cpu_seconds_of_its_own_cell(kind: str,
                                                                                    request: pytest.FixtureRequest):
    kernel: KernelSession = request.getfixturevalue(kind)
    held = kernel.run("python3 -c \"import time; b = bytearray(200 << 20); time.sleep(0.5)\"")
    assert held.status == "ok", held.outputs
    assert _cell_usage(held)["peak_memory_bytes"] >= 200 * MB, _cell_usage(held)
    trivial = kernel.run("true")
    assert _cell_usage(trivial)["peak_memory_bytes"] < 50 * MB, _cell_usage(trivial)  # per cell: the 200 MB is gone
    piped = kernel.run("head -c 200M /dev/zero | tail | wc -c")  # tail holds the one 200 MB "line"
    assert piped.text() == f"{200 * MB}\n" and _cell_usage(piped)["peak_memory_bytes"] >= 200 * MB, _cell_usage(piped)
    # A second of CPU by the process's own clock (a shared machine may take longer by the wall's), in a
    # child of a child: its time reaches the shell when each is reaped.
    busy = kernel.run("sh -c 'python3 -c \"import time\nwhile time.process_time() < 1: pass\"'")
    assert busy.status == "ok", busy.outputs
    assert 0.95 <= _cell_usage(busy)["cpu_seconds"] <= 2.0, _cell_usage(busy)
    assert _cell_usage(kernel.run("sleep 0.3"))["cpu_seconds"] < 0.2


def test_a_cell_that_runs_nothing_in_the_box_has_no_usage_figures(fresh_kernel: KernelSession):
    kernel = fresh_kernel
    assert kernel.run("echo up").status == "ok"
    run = kernel.run("%shells")
    assert run.status == "ok" and "usage" not in run.reply["metadata"].get("owsandbox", {})
