"""airlock-approval: policy decisions, operators' approvals, single-use tickets and session tokens (the approval and
operator doors)."""
