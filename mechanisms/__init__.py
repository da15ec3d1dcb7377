"""mechanisms: DP noise and privacy accounting for smooth-sensitivity private prediction.

Consumes what `agt` certifies (nominal predictions and smooth radii r = k*), never trains.

  noise.py        random generators and the one function that draws release noise
  guarantee.py    `Guarantee`: what a release gives (epsilon, delta, neighbouring relation)
  global_sens.py  global-sensitivity release of a binary prediction (Laplace, eps-DP)
  smooth.py       smooth-sensitivity release (Nissim-Raskhodnikova-Smith, Laplace / Cauchy)
  accounting.py   composition (standard, advanced, tight PLD) and its inverse
  ledger.py       persistent SQLite privacy ledger: check, then commit, then release

Every epsilon here is with respect to the neighbouring relation the bounds bundle certifies
("replace-one" or "add-remove"); callers pass it in and it is carried in each `Guarantee`.
"""
