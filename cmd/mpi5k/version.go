package main

import "fmt"

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func init() {
	register("version", "print the mpi5k version", func([]string) int {
		fmt.Println("mpi5k", version)
		return 0
	})
}
