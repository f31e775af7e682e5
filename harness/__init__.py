"""dsa-bench harness: scenario -> plan -> arms -> server -> load -> records -> stats -> verdict -> report."""
