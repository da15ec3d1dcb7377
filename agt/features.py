"""The training records as the engine reads them, and the features of a frozen prefix.

The first ``frozen_layers`` layers of a model (the prefix) keep their initial parameters,
so they are applied to the records once, before training: the nominal rule trains the
trainable part on the prefix's nominal outputs (in the training dtype), and the interval
pass bounds it on boxes that hold whatever the float prefix returns for a record. Without
a prefix the records themselves are both, the bound pass's copy exact in float64.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from agt.bounded.network import Network
from agt.data import Dataset
from agt.interval import BOUND_DTYPE, FloatModel, Interval
from agt.models import ModelSpec


@dataclass(frozen=True)
class FrozenPrefix:
    """The frozen layers of a model, applied to records.

    ``params``: the prefix's parameters (their initial values); ``fm``: the rounding model
    of the training dtype; ``fragment_size``: records per nominal pass;
    ``one_record_per_pass``: compute every record's feature box in a pass of its own, which
    add-remove certificates need (`features`)."""
    network: Network
    params: dict[str, torch.Tensor]
    fm: FloatModel
    fragment_size: int
    one_record_per_pass: bool

    @staticmethod
    def of_model(spec: ModelSpec, init: dict[str, torch.Tensor], fm: FloatModel,
                 fragment_size: int, one_record_per_pass: bool) -> "FrozenPrefix":
        """The prefix of ``spec`` with the frozen entries of ``init`` (every parameter,
        name -> tensor on the training device)."""
        trainable = spec.trainable_param_names()
        return FrozenPrefix(Network.prefix(spec),
                            {k: v for k, v in init.items() if k not in trainable},
                            fm, fragment_size, one_record_per_pass)

    def features(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | Interval]:
        """Inputs of the trainable part for the records ``x`` (n, ...) in the training dtype.

        Returns:
            The nominal inputs (training dtype) and the bound pass's: an exact float64
            copy of ``x`` without a prefix; behind one, a rounding-widened Interval
            (1, n, ...) that holds whatever the float prefix returns for a record in any
            batch layout, and is the same floats for a kept record in the run on any
            neighbour (`Network.feature_boxes`)."""
        if not self.network.layers:
            return x, x.to(BOUND_DTYPE)
        step = max(1, self.fragment_size)
        with torch.no_grad():
            nom = [self.network.forward_nominal(self.params, x[i:i + step])[0]
                   for i in range(0, x.shape[0], step)]
            # add-remove moves records between passes (`Network.feature_boxes`)
            rows = 1 if self.one_record_per_pass else step
            boxes = self.network.feature_boxes(self.params, x, self.fm, rows)
        return torch.cat(nom), boxes

    def magnitudes(self, x: torch.Tensor) -> torch.Tensor:
        """Per record of ``x`` (n, ...), a bound on every entry (and partial sum) of the
        prefix's nominal pass and its output (`Network.forward_magnitudes` from the record's
        largest |entry| as the dtype holds it; without a prefix that entry itself). inf or
        NaN for a record that is not finite in the dtype."""
        n = x.shape[0]
        raw = (x.reshape(n, -1).abs().amax(1).to(torch.float64) if x[0].numel()
               else torch.zeros(n, dtype=torch.float64, device=x.device))
        if not self.network.layers:
            return raw
        frozen = {k: float(v.abs().max()) for k, v in self.params.items()}
        return self.network.forward_magnitudes(frozen, raw)


@dataclass(frozen=True)
class TrainingRecords:
    """The training split as the passes read it.

    ``x_nominal`` (n, ...): the trainable part's inputs in the training dtype;
    ``x_bounds``: the bound pass's (`FrozenPrefix.features`); ``y`` (n,): the labels;
    ``magnitudes`` (n,): the bound of `FrozenPrefix.magnitudes` per record, which the
    overflow marking reads (agt/overflow.py)."""
    x_nominal: torch.Tensor
    x_bounds: torch.Tensor | Interval
    y: torch.Tensor
    magnitudes: torch.Tensor

    @staticmethod
    def prepare(ds: Dataset, prefix: FrozenPrefix, dtype: torch.dtype,
                device: torch.device) -> "TrainingRecords":
        """The records of ``ds``'s training split, cast to ``dtype`` on ``device`` and put
        through ``prefix``.

        Args:
            ds: the dataset (its training split is read).
            prefix: the model's frozen prefix (possibly of no layers).
            dtype: the training dtype.
            device: the training device.

        Returns:
            The records' inputs for both passes, labels and magnitudes."""
        x = torch.as_tensor(ds.x_train, dtype=dtype, device=device)
        y = torch.as_tensor(ds.y_train, dtype=torch.int64, device=device)
        x_nominal, x_bounds = prefix.features(x)
        return TrainingRecords(x_nominal, x_bounds, y, prefix.magnitudes(x))

    @property
    def input_shape(self) -> tuple[int, ...]:
        """The shape of one record's input to the trainable part."""
        return tuple(self.x_nominal.shape[1:])

    def bound_inputs(self, idx: torch.Tensor, marked: torch.Tensor | None = None):
        """The bound pass's inputs for records ``idx``; rows flagged in ``marked`` are
        zeros (their bounds are replaced anyway, agt/overflow.py, and an overflowing row
        would only make NaN)."""
        xb = self.x_bounds
        if isinstance(xb, Interval):
            out = Interval(xb.lo[:, idx], xb.hi[:, idx])
            if marked is not None:
                out.lo[:, marked] = 0.0
                out.hi[:, marked] = 0.0
            return out
        out = xb[idx]
        if marked is not None:
            out[marked] = 0.0
        return out
