"""Placement plugins: health, gpu-fit, gang, topology, binpack, mig-packing.

Each module exposes `NAME` and a class taking the profile args; `gangline.core.defaults`
registers them explicitly.
"""
