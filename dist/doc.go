// Package dist holds what `make install` and `make deb` put on a host
// besides the binaries: the systemd unit, its keep-warm helper, the example
// configuration and the Debian package's metadata. Its tests build both and
// check what they contain.
package dist
