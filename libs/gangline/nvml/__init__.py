"""NVML access for the node agent: the reader, its data-driven stand-in, and GPU health classification.

``reader`` talks to anything with NVML's call surface (the real ``pynvml`` module or ``NvmlStandIn``);
``health`` is pure: it turns readings and XID events into cordon / drain / fail-job / watch findings.
"""
