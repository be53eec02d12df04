package gateway

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
)

// NewKeyPEM makes an Ed25519 key pair and returns its public key and the
// private key as the text of a key file (what GenerateKey writes and
// LoadKey reads), for a caller that places the file itself (mpi5k run,
// on each gateway host through its launcher).
func NewKeyPEM() (ed25519.PublicKey, []byte, error) {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	der, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		return nil, nil, err
	}
	return pub, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}
