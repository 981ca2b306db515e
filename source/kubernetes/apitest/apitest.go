// Package apitest runs a real etcd and kube-apiserver on 127.0.0.1 for
// tests: the binaries test/k8s/rig.sh builds from the Go module proxy and
// caches. There is no controller-manager, scheduler or kubelet: tests
// create the Nodes and EndpointSlices they need.
package apitest

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"k8s.io/client-go/rest"
)

// KubernetesVersion is the release rig.sh builds kube-apiserver from; its
// binaries live in $VIPD_K8S_CACHE/KubernetesVersion.
const KubernetesVersion = "v1.37.2"

// ServiceCIDRs are the Services' cluster IP ranges, IPv4 and IPv6: the
// API server is dual-stack.
const ServiceCIDRs = "10.96.0.0/16,fd00:10:96::/112"

// AssetsDir returns where the binaries are: $VIPD_K8S_ASSETS, or
// ${VIPD_K8S_CACHE:-/var/cache/vipd-k8s}/KubernetesVersion.
func AssetsDir() string {
	if d := os.Getenv("VIPD_K8S_ASSETS"); d != "" {
		return d
	}
	cache := os.Getenv("VIPD_K8S_CACHE")
	if cache == "" {
		cache = "/var/cache/vipd-k8s"
	}
	return filepath.Join(cache, KubernetesVersion)
}

// Server is a running etcd and kube-apiserver.
type Server struct {
	// Config reaches the API server as a member of system:masters, by a
	// bearer token, verifying its certificate.
	Config *rest.Config
	// Kubeconfig is a kubeconfig file with the same credentials.
	Kubeconfig string

	t                      testing.TB
	dir, assets            string
	etcdPort, etcdPeerPort int
	apiPort                int
	token                  string
	etcd, api              *proc
}

// proc is a started binary and the end of its wait.
type proc struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
	err  error
}

// Start starts etcd and kube-apiserver, waits until /readyz answers ok,
// and stops both and removes their files when the test ends. Without the
// binaries it fails the test when CI=true, and skips it otherwise.
func Start(t testing.TB) *Server {
	t.Helper()
	assets := AssetsDir()
	for _, bin := range []string{"etcd", "kube-apiserver"} {
		if _, err := os.Stat(filepath.Join(assets, bin)); err != nil {
			msg := fmt.Sprintf("no %s in %s (run test/k8s/rig.sh, or make k8s-rig, to build it): %v", bin, assets, err)
			if os.Getenv("CI") == "true" {
				t.Fatal(msg)
			}
			t.Skip(msg)
		}
	}
	s := &Server{t: t, dir: t.TempDir(), assets: assets}
	t.Cleanup(s.stop)
	if err := s.setup(); err != nil {
		t.Fatal(err)
	}
	var err error
	for range 3 {
		if err = s.startEtcd(); err == nil {
			break
		}
		// A port picked free may have been taken since: pick again.
		t.Logf("apitest: %v; retrying with other ports", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	if err := s.StartAPIServer(); err != nil {
		t.Fatal(err)
	}
	return s
}

// setup writes the token file, the service-account key and the
// kubeconfig.
func (s *Server) setup() error {
	tok := make([]byte, 16)
	rand.Read(tok)
	s.token = hex.EncodeToString(tok)
	if err := os.WriteFile(filepath.Join(s.dir, "tokens.csv"), []byte(s.token+`,admin,admin,"system:masters"`+"\n"), 0o600); err != nil {
		return err
	}
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return err
	}
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)})
	if err := os.WriteFile(filepath.Join(s.dir, "sa.key"), keyPEM, 0o600); err != nil {
		return err
	}
	port, err := freePort()
	if err != nil {
		return err
	}
	s.apiPort = port
	host := "https://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	ca := filepath.Join(s.dir, "certs", "apiserver.crt")
	s.Config = &rest.Config{Host: host, BearerToken: s.token, TLSClientConfig: rest.TLSClientConfig{CAFile: ca}}
	s.Kubeconfig = filepath.Join(s.dir, "kubeconfig")
	kc := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: apitest
  cluster:
    server: %s
    certificate-authority: %s
users:
- name: admin
  user:
    token: %s
contexts:
- name: apitest
  context:
    cluster: apitest
    user: admin
current-context: apitest
`, host, ca, s.token)
	return os.WriteFile(s.Kubeconfig, []byte(kc), 0o600)
}

func (s *Server) startEtcd() error {
	var err error
	if s.etcdPort, err = freePort(); err != nil {
		return err
	}
	if s.etcdPeerPort, err = freePort(); err != nil {
		return err
	}
	client := "http://127.0.0.1:" + strconv.Itoa(s.etcdPort)
	peer := "http://127.0.0.1:" + strconv.Itoa(s.etcdPeerPort)
	data := filepath.Join(s.dir, "etcd")
	os.RemoveAll(data)
	p, err := s.start("etcd",
		"--name=apitest", "--data-dir="+data,
		"--listen-client-urls="+client, "--advertise-client-urls="+client,
		"--listen-peer-urls="+peer, "--initial-advertise-peer-urls="+peer,
		"--initial-cluster=apitest="+peer,
		"--unsafe-no-fsync", "--log-level=warn")
	if err != nil {
		return err
	}
	s.etcd = p
	if err := s.wait(p, client+"/health", nil, 30*time.Second); err != nil {
		s.kill(p)
		s.etcd = nil
		return err
	}
	return nil
}

// StartAPIServer starts kube-apiserver (again, after StopAPIServer) on
// the same port, and waits until /readyz answers ok.
func (s *Server) StartAPIServer() error {
	if s.api != nil {
		return errors.New("apitest: kube-apiserver is running")
	}
	p, err := s.start("kube-apiserver",
		"--etcd-servers=http://127.0.0.1:"+strconv.Itoa(s.etcdPort),
		"--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
		"--secure-port="+strconv.Itoa(s.apiPort),
		"--cert-dir="+filepath.Join(s.dir, "certs"),
		"--service-cluster-ip-range="+ServiceCIDRs,
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file="+filepath.Join(s.dir, "sa.key"),
		"--service-account-signing-key-file="+filepath.Join(s.dir, "sa.key"),
		"--token-auth-file="+filepath.Join(s.dir, "tokens.csv"),
		"--authorization-mode=RBAC",
		"--disable-admission-plugins=ServiceAccount",
		"--endpoint-reconciler-type=none")
	if err != nil {
		return err
	}
	s.api = p
	tr := &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}
	defer tr.CloseIdleConnections()
	// Under the qemu guest's software emulation it takes a minute or two.
	timeout := 90 * time.Second
	if os.Getenv("VIPD_VM") == "1" {
		timeout = 240 * time.Second
	}
	if err := s.wait(p, s.Config.Host+"/readyz", tr, timeout); err != nil {
		return err
	}
	return nil
}

// StopAPIServer kills kube-apiserver, leaving etcd and its data: a test
// of API loss.
func (s *Server) StopAPIServer() {
	if s.api != nil {
		s.kill(s.api)
		s.api = nil
	}
}

// start starts a binary of the rig, its output going to a log file.
func (s *Server) start(name string, args ...string) (*proc, error) {
	logPath := filepath.Join(s.dir, name+".log")
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	cmd := exec.Command(filepath.Join(s.assets, name), args...)
	cmd.Stdout, cmd.Stderr = f, f
	// Die with the test binary, even when it is killed.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := startOnKeptThread(cmd); err != nil {
		return nil, fmt.Errorf("apitest: starting %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() { p.err = cmd.Wait(); close(p.done) }()
	return p, nil
}

// wait polls url until it answers 200 with a bearer token, p exits, or
// the timeout passes.
func (s *Server) wait(p *proc, url string, tr http.RoundTripper, timeout time.Duration) error {
	c := &http.Client{Transport: tr, Timeout: 2 * time.Second}
	deadline := time.Now().Add(timeout)
	var last string
	for time.Now().Before(deadline) {
		select {
		case <-p.done:
			return fmt.Errorf("apitest: %s exited (%v) before %s answered; its log ends:\n%s", p.name, p.err, url, tail(p.log))
		default:
		}
		req, _ := http.NewRequestWithContext(context.Background(), http.MethodGet, url, nil)
		req.Header.Set("Authorization", "Bearer "+s.token)
		resp, err := c.Do(req)
		if err == nil {
			body := make([]byte, 512)
			n, _ := resp.Body.Read(body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			last = fmt.Sprintf("%s: %s", resp.Status, bytes.TrimSpace(body[:n]))
		} else {
			last = err.Error()
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("apitest: %s not ready after %s (last: %s); %s's log ends:\n%s", url, timeout, last, p.name, tail(p.log))
}

// kill stops p at once, as a crash would: its data is either thrown away
// or, for etcd's, already written (the API server writes through to
// etcd). A graceful kube-apiserver stop waits for its watches to drain.
func (s *Server) kill(p *proc) {
	syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.done
}

// stop stops both binaries; when the test failed, it logs the end of
// their logs.
func (s *Server) stop() {
	for _, p := range []*proc{s.api, s.etcd} {
		if p == nil {
			continue
		}
		s.kill(p)
		if s.t.Failed() {
			s.t.Logf("apitest: %s's log ends:\n%s", p.name, tail(p.log))
		}
	}
	s.api, s.etcd = nil, nil
}

// tail returns the last lines of a log file.
func tail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > 30 {
		lines = lines[len(lines)-30:]
	}
	return strings.Join(lines, "\n")
}

// freePort returns a TCP port of 127.0.0.1 that was free a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// The parent-death signal comes when the thread that started the child
// ends, not the process (golang/go#27505), and the runtime ends a thread
// when a goroutine exits locked to it, as tests that enter a network
// namespace do: a binary started on a thread such a goroutine used later
// would be killed with it. startOnKeptThread starts cmd on one thread
// that lives as long as the process.
var (
	keptOnce   sync.Once
	keptStarts chan func()
)

func startOnKeptThread(cmd *exec.Cmd) error {
	keptOnce.Do(func() {
		keptStarts = make(chan func())
		go func() {
			runtime.LockOSThread() // never unlocked: the thread stays.
			for f := range keptStarts {
				f()
			}
		}()
	})
	done := make(chan error)
	keptStarts <- func() { done <- cmd.Start() }
	return <-done
}
