package egress

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"
)

// CA is the installation's certificate authority for the one host whose
// TLS the proxy terminates (the Git host of paired sessions). Its
// certificate is name-constrained to that host, so even its key could sign
// for nothing else; sandboxes trust it, the key never leaves the server.
// Safe for concurrent use.
type CA struct {
	cert *x509.Certificate
	key  crypto.Signer
	pem  []byte

	mu     sync.Mutex
	leaves map[string]*tls.Certificate
}

const (
	caCertFile = "ca.pem"
	caKeyFile  = "ca-key.pem"
	caValidity = 10 * 365 * 24 * time.Hour
	leafLife   = 30 * 24 * time.Hour
)

// LoadCA reads the CA kept in dir (ca.pem and ca-key.pem, 0600), or makes
// one when there is none or the one there is constrained to another host
// (the configured Git host changed).
func LoadCA(dir, host string) (*CA, error) {
	if _, _, err := normalizeHost(host); err != nil || host == "" {
		return nil, fmt.Errorf("egress CA: bad host %q", host)
	}
	ca, err := readCA(dir)
	if err == nil && slices.Equal(ca.cert.PermittedDNSDomains, []string{host}) && slices.Equal(ca.cert.ExcludedDNSDomains, []string{"." + host}) &&
		len(ca.cert.ExcludedIPRanges) == 2 && time.Until(ca.cert.NotAfter) > 30*24*time.Hour {
		return ca, nil
	}
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	return newCA(dir, host)
}

func readCA(dir string) (*CA, error) {
	cb, err := os.ReadFile(filepath.Join(dir, caCertFile))
	if err != nil {
		return nil, err
	}
	kb, err := os.ReadFile(filepath.Join(dir, caKeyFile))
	if err != nil {
		return nil, err
	}
	cblk, _ := pem.Decode(cb)
	kblk, _ := pem.Decode(kb)
	if cblk == nil || kblk == nil {
		return nil, fmt.Errorf("egress CA in %s: not PEM", dir)
	}
	cert, err := x509.ParseCertificate(cblk.Bytes)
	if err != nil {
		return nil, fmt.Errorf("egress CA: %w", err)
	}
	k, err := x509.ParsePKCS8PrivateKey(kblk.Bytes)
	if err != nil {
		return nil, fmt.Errorf("egress CA key: %w", err)
	}
	key, ok := k.(crypto.Signer)
	if !ok {
		return nil, errors.New("egress CA key: not a signing key")
	}
	return &CA{cert: cert, key: key, pem: cb, leaves: map[string]*tls.Certificate{}}, nil
}

func newCA(dir, host string) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:                serial,
		Subject:                     pkix.Name{CommonName: "sandboxd Git host CA (" + host + ")", Organization: []string{"sandboxd installation"}},
		NotBefore:                   now.Add(-time.Hour),
		NotAfter:                    now.Add(caValidity),
		IsCA:                        true,
		BasicConstraintsValid:       true,
		MaxPathLenZero:              true,
		KeyUsage:                    x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		PermittedDNSDomainsCritical: true,
		PermittedDNSDomains:         []string{host},
		// Not its subdomains, and no IP address at all.
		ExcludedDNSDomains: []string{"." + host},
		ExcludedIPRanges:   []*net.IPNet{{IP: net.IPv4zero, Mask: net.CIDRMask(0, 32)}, {IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)}},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	cpem := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	// The key first: a cert without its key is rebuilt, never trusted alone.
	if err := writeFileAtomic(filepath.Join(dir, caKeyFile), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		return nil, err
	}
	if err := writeFileAtomic(filepath.Join(dir, caCertFile), cpem, 0o644); err != nil {
		return nil, err
	}
	return &CA{cert: cert, key: key, pem: cpem, leaves: map[string]*tls.Certificate{}}, nil
}

func writeFileAtomic(path string, b []byte, mode os.FileMode) error {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, mode)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// PEM is the CA's certificate, for sandboxes to trust.
func (ca *CA) PEM() []byte { return bytes.Clone(ca.pem) }

// Bundle returns system (the PEM bundle sandboxes trust otherwise) with the
// CA's certificate appended.
func (ca *CA) Bundle(system []byte) []byte {
	out := bytes.Clone(system)
	if len(out) > 0 && out[len(out)-1] != '\n' {
		out = append(out, '\n')
	}
	return append(out, ca.pem...)
}

// leaf returns a server certificate for host, made on first use and again
// when it nears its end.
func (ca *CA) leaf(host string) (*tls.Certificate, error) {
	ca.mu.Lock()
	defer ca.mu.Unlock()
	if c := ca.leaves[host]; c != nil && time.Until(c.Leaf.NotAfter) > leafLife/4 {
		return c, nil
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: host},
		DNSNames:     []string{host},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(leafLife),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		return nil, err
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	c := &tls.Certificate{Certificate: [][]byte{der, ca.cert.Raw}, PrivateKey: key, Leaf: leaf}
	ca.leaves[host] = c
	return c, nil
}
