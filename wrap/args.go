package wrap

import (
	"strings"
)

// argOption is one option found on the launcher's command line.
type argOption struct {
	Index  int      // position of the option word in argv
	Name   string   // without "=value"
	Values []string // its values (from "=value" or the following words)
	Inline bool     // value given as --name=value
}

// scanArgs walks an mpirun argv (argv[0] the launcher) and returns the
// options and the index of the program (len(argv) if there is none).
// Options the flavour's arity does not list are guessed.
func scanArgs(f Flavour, argv []string) (opts []argOption, prog int) {
	arity := f.arity()
	i := 1
	for i < len(argv) {
		a := argv[i]
		if a == "--" {
			return opts, i + 1
		}
		if a == ":" || !strings.HasPrefix(a, "-") || a == "-" {
			return opts, i
		}
		name, val, inline := strings.Cut(a, "=")
		o := argOption{Index: i, Name: name, Inline: inline}
		n, known := arity[name]
		if !known {
			n = guessArity(argv, i)
		}
		if inline {
			o.Values = []string{val}
			n--
		}
		for ; n > 0 && i+1 < len(argv); n-- {
			i++
			o.Values = append(o.Values, argv[i])
		}
		opts = append(opts, o)
		i++
	}
	return opts, len(argv)
}

// guessArity decides whether an unknown option takes one value: not when
// the next word is another option or looks like the program to run.
func guessArity(argv []string, i int) int {
	if i+1 >= len(argv) {
		return 0
	}
	next := argv[i+1]
	if strings.HasPrefix(next, "-") || looksLikeProgram(next) {
		return 0
	}
	return 1
}

func looksLikeProgram(w string) bool {
	if strings.Contains(w, "/") {
		return true
	}
	_, err := lookPath(w)
	return err == nil
}

// afterLauncher inserts words right after the launcher word, where every
// launcher takes its options.
func afterLauncher(argv []string, words ...string) []string {
	out := make([]string, 0, len(argv)+len(words))
	out = append(out, argv[0])
	out = append(out, words...)
	return append(out, argv[1:]...)
}
