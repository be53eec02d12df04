package wrap

// ShellJoin quotes argv as one command line for the remote shell through
// which ssh and oarsh run a command.
func ShellJoin(argv []string) string { return shellJoin(argv) }
