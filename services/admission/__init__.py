"""Admission: validates job requests against schema and policy; admitted or rejected, never silent."""
