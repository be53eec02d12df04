// Command gohost is a Go program with cgo that calls libc's connect(): the
// shim, preloaded into it, must notice the Go runtime already there and stay
// passive (TestGoHostPassive). Usage: gohost SRC DST PORT
package main

/*
#include <arpa/inet.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <stdlib.h>

static int dial(const char *src, const char *dst, int port) {
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in sa;
	memset(&sa, 0, sizeof sa);
	sa.sin_family = AF_INET;
	inet_pton(AF_INET, src, &sa.sin_addr);
	if (bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0) return -1;
	sa.sin_port = htons(port);
	inet_pton(AF_INET, dst, &sa.sin_addr);
	if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) return -1;
	char c = 'x';
	if (write(fd, &c, 1) != 1 || read(fd, &c, 1) != 1) return -1;
	return close(fd);
}
*/
import "C"

import (
	"fmt"
	"os"
	"strconv"
	"unsafe"
)

func main() {
	if len(os.Args) != 4 {
		fmt.Fprintln(os.Stderr, "usage: gohost SRC DST PORT")
		os.Exit(2)
	}
	port, _ := strconv.Atoi(os.Args[3])
	src, dst := C.CString(os.Args[1]), C.CString(os.Args[2])
	defer C.free(unsafe.Pointer(src))
	defer C.free(unsafe.Pointer(dst))
	if C.dial(src, dst, C.int(port)) != 0 {
		fmt.Println("dial failed")
		os.Exit(1)
	}
	fmt.Println("gohost ok")
}
