package wrap

// ShellQuote quotes s as one word for the remote shell through which ssh
// and oarsh run a command.
func ShellQuote(s string) string { return shellQuote(s) }
