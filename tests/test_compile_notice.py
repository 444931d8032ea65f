"""The first run after install says on stderr what numba compiles and how long it took; a run that
loads the machine code from numba's cache says nothing."""

from __future__ import annotations

import numba
import pytest

from rlperf.env.fused import compile_notice


def test_a_compile_is_one_line_on_stderr_and_a_compiled_call_none(capsys: pytest.CaptureFixture[str]) -> None:
    @numba.njit(cache=False)
    def double(x: int) -> int:
        return 2 * x

    with compile_notice("the test kernel"):
        assert double(3) == 6
    err = capsys.readouterr().err
    assert err.startswith("rlperf: compiled the test kernel in ") and err.count("\n") == 1
    assert "numba" in err and " s " in err
    with compile_notice("the test kernel"):
        assert double(4) == 8  # compiled already: no event, no line
    assert capsys.readouterr().err == ""


def test_a_failed_compile_still_ends_its_line(capsys: pytest.CaptureFixture[str]) -> None:
    @numba.njit(cache=False)
    def broken(x: int) -> int:
        return x.no_such_attribute  # type: ignore[attr-defined,no-any-return]

    with pytest.raises(numba.core.errors.TypingError), compile_notice("the broken kernel"):
        broken(1)
    assert "(failed)" in capsys.readouterr().err
