"""MLPerf logging, compliance checking and (later) submission packaging."""
