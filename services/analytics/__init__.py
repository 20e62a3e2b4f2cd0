"""Analytics: windowed GPU-hours, utilisation, waits, preemptions and final states, on faust-streaming."""
