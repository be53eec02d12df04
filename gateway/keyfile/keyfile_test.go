package keyfile

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"strings"
	"testing"
)

func TestNewParse(t *testing.T) {
	pub, text, err := New()
	if err != nil {
		t.Fatal(err)
	}
	k, err := Parse(text)
	if err != nil {
		t.Fatal(err)
	}
	if !pub.Equal(k.Public()) {
		t.Errorf("the parsed key's public key differs from New's")
	}
	if _, err := Parse([]byte("not a key")); err == nil || !strings.Contains(err.Error(), `no PEM "PRIVATE KEY" block`) {
		t.Errorf("not PEM: %v", err)
	}
	ec, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	der, _ := x509.MarshalPKCS8PrivateKey(ec)
	if _, err := Parse(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})); err == nil || !strings.Contains(err.Error(), "want an Ed25519 key") {
		t.Errorf("an ECDSA key: %v", err)
	}
}
