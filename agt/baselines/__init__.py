"""Private *training* baselines, the comparison points of private prediction.

  dpsgd.py   DP-SGD (Opacus) of the AGT run's model, to a target (eps, delta)
"""
