"""The CPU fallback names the operators it serves: a query, and an opt-in
notice once per operator (quiet by default)."""

import torch


def test_fallback_ops_lists_operators_that_ran():
    x = torch.randn(8, device="openreg")
    torch.special.erfcx(x)  # served by the fallback
    assert any("erfcx" in name for name in torch.openreg.fallback_ops())


def test_quiet_by_default(py):
    out = py(
        """
        import warnings, torch
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            x = torch.randn(4, device="openreg")
            print(x)
            torch.special.i0e(x).sum().item()
        print(len(caught))
        """
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[-1] == "0"
    assert "CPU fallback" not in out.stderr


def test_warning_once_per_operator_and_silencing(py):
    out = py(
        """
        import warnings, torch
        x = torch.randn(4, device="openreg")
        torch.openreg.set_fallback_warnings(True)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.special.i0e(x); torch.special.i0e(x)
        notes = [str(w.message) for w in caught if "CPU fallback" in str(w.message)]
        print(sum("i0e" in n for n in notes))
        torch.openreg.set_fallback_warnings(False)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.special.ndtri(x)
        print(sum("CPU fallback" in str(w.message) for w in caught))
        """
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["1", "0"]
