"""Trace-driven simulation: trace adapters, cluster specs, virtual clock, simulator, metrics, report, plots.

Pure except for reading trace/spec files and writing reports and plots; the core runs unchanged.
"""
