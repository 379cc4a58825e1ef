"""The Jupyter messaging conformance suite (jupyter_kernel_test) against the real kernel."""

from __future__ import annotations

import unittest

import jupyter_kernel_test

from .conftest import KERNEL_NAME


class OwSandboxConformance(jupyter_kernel_test.KernelTests):
    kernel_name = KERNEL_NAME
    language_name = "bash"
    file_extension = ".sh"

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        # The kernel's first cell says where commands run (a note of its own): said here, before the
        # tests that count a cell's outputs, whichever of them comes first.
        reply = cls.kc.execute_interactive("true", timeout=120)
        assert reply["content"]["status"] == "ok", reply

    code_hello_world = "echo 'hello, world'"
    code_stderr = "echo 'to stderr' >&2"
    code_generate_error = "false"
    code_inspect_sample = "printf"
    code_display_data = [
        {"code": "f=$(mktemp --suffix=.html); printf '<b>shown</b>' > \"$f\"; owdisplay \"$f\"", "mime": "text/html"},
        {"code": "f=$(mktemp --suffix=.json); echo '{\"a\": 1}' > \"$f\"; owdisplay \"$f\"",
         "mime": "application/json"},
        {"code": "%ls /", "mime": "text/html"},
    ]
    completion_samples = [
        {"text": "%sand", "matches": {"%sandbox"}},
        {"text": "%%wri", "matches": {"%%write"}},
    ]
    complete_code_samples = ["echo hi", "if true; then echo yes; fi", "cat <<EOF\nbody\nEOF", "%ls", "%%write x\ny\n"]
    incomplete_code_samples = ["if true; then", "echo 'open quote", "for i in 1 2; do", "echo \\", "cat <<EOF\nbody",
                               "%%write x"]
    invalid_code_samples = ["fi", "done", "esac"]
    # No code_execute_result: as in a bash kernel, nothing is a cell's value (Out[n]); magics print their answers.
    supported_history_operations = ("tail", "range", "search")
    code_history_pattern = "%outp*"
    code_page_something = "%page /etc/hostname"
    code_clear_output = "%clear"


if __name__ == "__main__":
    unittest.main()
