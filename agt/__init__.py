"""agt: Abstract Gradient Training for smooth-sensitivity private prediction.

The package `agt` certifies (sound parameter bounds, prediction stability); the sibling
package `mechanisms` adds DP noise and does the privacy accounting.
"""

__version__ = "0.1.0"
