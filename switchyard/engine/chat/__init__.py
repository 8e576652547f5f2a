"""chat: the tokenizer and chat template, tool calls (tools, tool_stream), structured output (structured builds, grammar compiles and masks, grammar_process fills masks in a process of their own)."""
