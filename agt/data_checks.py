"""Warnings about training data and fit that an owner should see before releasing anything.

Three silent failures a new user met (a model that predicts the majority class only on raw
features, and certifies everything at large k because of it; a class with no training
record): each now gives one line, as a `DataWarning`. The checks read the private training
split, so what they print is owner-only, like the rest of training's output.
"""

from __future__ import annotations

import warnings

import numpy as np

#: features whose root mean square lies outside [1 / FAR, FAR] are "far from unit scale"
FAR_FROM_UNIT = 20.0


class DataWarning(UserWarning):
    """A training split or a trained model that is probably not what the owner meant."""


def _warn(message: str) -> None:
    warnings.warn(message, DataWarning, stacklevel=3)


def check_training_data(dataset, scaled: bool = False) -> list[str]:
    """Warn when features are far from unit scale or a class has no training record.

    Args:
        dataset: the `agt.Dataset` as the trainer will see it (after any input scale).
        scaled: whether an input scale was applied (changes the advice).

    Returns:
        The warnings issued (each also issued as a `DataWarning`).
    """
    issued = []
    x = np.asarray(dataset.x_train, dtype=np.float64).reshape(dataset.n_train, -1)
    if x.size:
        rms = np.sqrt((x * x).mean(axis=0))
        worst = int(np.argmax(rms))
        if rms[worst] > FAR_FROM_UNIT or 0 < rms.max() < 1 / FAR_FROM_UNIT:
            advice = ("check the input scale" if scaled else
                      "scale them with public statistics or fixed bounds "
                      "(agt train --scale-from public.npz, agt.InputScale), never with "
                      "statistics of the private training set")
            issued.append(f"training features are far from unit scale (root mean square up to "
                          f"{rms[worst]:.3g}, feature {worst}): AGT's bounds and the learning "
                          f"rate assume roughly unit scale; {advice}")
    counts = np.bincount(np.asarray(dataset.y_train, dtype=np.int64),
                         minlength=dataset.n_classes)
    missing = [int(c) for c in np.flatnonzero(counts == 0)]
    if missing:
        issued.append(f"class{'es' if len(missing) > 1 else ''} "
                      f"{', '.join(map(str, missing))} of {dataset.n_classes} "
                      f"ha{'ve' if len(missing) > 1 else 's'} no record in the training split: "
                      f"the model cannot learn to predict it; check the labels and the split")
    for message in issued:
        _warn(message)
    return issued


def check_fit(train_prediction, y_train) -> list[str]:
    """Warn when the trained model does no better than the majority class on its training
    records (typically: it predicts one class only).

    Args:
        train_prediction: the served model's classes on the training records, shape (n,).
        y_train: the training labels, shape (n,).

    Returns:
        The warnings issued (each also issued as a `DataWarning`).
    """
    pred = np.asarray(train_prediction)
    y = np.asarray(y_train)
    if y.size == 0:
        return []
    accuracy = float((pred == y).mean())
    counts = np.bincount(y)
    majority = float(counts.max()) / y.size
    if accuracy > majority + 0.5 / y.size:
        return []
    classes = np.unique(pred)
    what = (f"it predicts class {int(classes[0])} for every record" if len(classes) == 1
            else "no better than always predicting the most frequent class")
    message = (f"training accuracy {accuracy:.3f} is no better than the majority-class rate "
               f"({majority:.3f}): {what}; check the input scale, the learning rate and the "
               f"number of epochs before releasing anything")
    _warn(message)
    return [message]
