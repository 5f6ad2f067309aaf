"""`airlock mcp`: an MCP server on stdin/stdout whose tools are the agent door's verbs."""
