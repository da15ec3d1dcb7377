"""Certificate.summary / repr / plot: numbers a person reads, computed from the arrays."""

from __future__ import annotations

import numpy as np
import pytest

from agt.certify import Certificate
from agt.errors import DataError


def _cert(radius, prediction=None) -> Certificate:
    radius = np.asarray(radius, dtype=np.int64)
    prediction = np.zeros(len(radius), np.int64) if prediction is None else np.asarray(prediction)
    return Certificate(prediction=prediction, max_certified_k=radius.copy(), radius=radius,
                       k_values=tuple(range(6)), contiguous=True, source_id="abc123")


def test_summary_counts_accuracy_fractions_and_quantiles():
    cert = _cert([-1, 0, 2, 5, 5], prediction=[0, 1, 1, 0, 1])
    s = cert.summary(labels=[0, 1, 0, 0, 0])
    assert s.n_queries == 5 and s.accuracy == pytest.approx(3 / 5) and s.uncertified == 1
    assert s.certified_fraction == {0: 0.8, 1: 0.6, 2: 0.6, 3: 0.4, 4: 0.4, 5: 0.4}
    assert s.radius_quantiles[0.1] == -1 and s.radius_quantiles[0.5] == 2
    assert s.radius_quantiles[0.9] == 5
    text = str(s)
    assert "accuracy vs labels: 0.6000" in text and "k=5" in text and "q50 2" in text
    assert cert.summary().accuracy is None
    with pytest.raises(DataError, match="one label per query"):
        cert.summary(labels=[0, 1])


def test_repr_is_one_line_without_arrays():
    text = repr(_cert(np.arange(-1, 5).repeat(100)))
    assert "\n" not in text and "[" not in text and len(text) < 200
    assert "600 queries" in text and "abc123" in text and "owner-only" in text


def test_plot_draws_the_certify_figure_and_saves_it(tmp_path):
    fig = _cert([-1, 0, 2, 5, 5]).plot(tmp_path / "sub" / "cert.png")
    assert len(fig.axes) == 2
    assert fig.axes[0].get_title() == "Certified fraction vs k"
    assert (tmp_path / "sub" / "cert.png").stat().st_size > 1000


def test_progress_defaults_to_whether_stderr_is_a_terminal(monkeypatch):
    import sys

    from agt import api

    class Stream:
        def __init__(self, tty):
            self.tty = tty

        def isatty(self):
            return self.tty

    monkeypatch.setattr(sys, "stderr", Stream(True))
    assert api._stderr_is_a_terminal()
    monkeypatch.setattr(sys, "stderr", Stream(False))
    assert not api._stderr_is_a_terminal()
