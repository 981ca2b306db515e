// Command rignode is the real-kernel rig's traffic tool. It runs inside the
// qemu test guest (see test/vm/topo.sh), never on the host.
//
//	rignode serve -name be1 [-http :80,:8080] [-udp :53] [-ready FILE] [-down FILE]
//	rignode hit [-n 10] [-udp] [-timeout 2s] [-local IP] URL|HOST:PORT
//
// serve is a backend that says who it is:
//
//	GET /         "be1\n"                  (and header X-Backend: be1)
//	GET /whoami   "be1 CLIENT:PORT LOCAL:PORT\n"
//	GET /healthz  200 "ok", or 503 while the -down file exists
//	GET /sleep?d=2s  waits, then answers like /  (for draining tests)
//	UDP datagram  "be1\n" ("be1 CLIENT:PORT\n" if the datagram is "whoami")
//
// hit sends N requests, each on a new connection (new source port), and prints
// one JSON line: {"ok":N,"errors":N,"counts":{"be1":5,...},"sequence":[...],
// "error_samples":[...]}. The backend name is the first word of each answer.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"
)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	var err error
	switch os.Args[1] {
	case "serve":
		err = serve(os.Args[2:])
	case "hit":
		err = hit(os.Args[2:])
	default:
		usage()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "rignode:", err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: rignode serve -name NAME [-http :80] [-udp :53] [-ready FILE] [-down FILE]\n       rignode hit [-n 10] [-udp] [-timeout 2s] [-local IP] URL|HOST:PORT")
	os.Exit(2)
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

func serve(args []string) error {
	fs := flag.NewFlagSet("serve", flag.ExitOnError)
	name := fs.String("name", "", "backend name to answer with (required)")
	httpAddrs := fs.String("http", ":80", "comma-separated TCP listen addresses for HTTP")
	udpAddrs := fs.String("udp", "", "comma-separated UDP listen addresses")
	ready := fs.String("ready", "", "file to create once all sockets listen")
	down := fs.String("down", "", "while this file exists /healthz answers 503")
	_ = fs.Parse(args)
	if *name == "" {
		return errors.New("serve: -name is required")
	}

	mux := http.NewServeMux()
	answer := func(w http.ResponseWriter) {
		w.Header().Set("X-Backend", *name)
		fmt.Fprintf(w, "%s\n", *name)
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) { answer(w) })
	mux.HandleFunc("/whoami", func(w http.ResponseWriter, r *http.Request) {
		local, _ := r.Context().Value(http.LocalAddrContextKey).(net.Addr)
		w.Header().Set("X-Backend", *name)
		fmt.Fprintf(w, "%s %s %v\n", *name, r.RemoteAddr, local)
	})
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		if *down != "" {
			if _, err := os.Stat(*down); err == nil {
				http.Error(w, "down", http.StatusServiceUnavailable)
				return
			}
		}
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("/sleep", func(w http.ResponseWriter, r *http.Request) {
		d, err := time.ParseDuration(r.URL.Query().Get("d"))
		if err != nil {
			d = time.Second
		}
		select {
		case <-time.After(d):
		case <-r.Context().Done():
			return
		}
		answer(w)
	})

	errc := make(chan error, 8)
	for _, a := range splitList(*httpAddrs) {
		ln, err := net.Listen("tcp", a)
		if err != nil {
			return err
		}
		srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		go func() { errc <- srv.Serve(ln) }()
	}
	for _, a := range splitList(*udpAddrs) {
		pc, err := net.ListenPacket("udp", a)
		if err != nil {
			return err
		}
		go func() { errc <- serveUDP(pc, *name) }()
	}
	if *ready != "" {
		if err := os.WriteFile(*ready, []byte(fmt.Sprintln(os.Getpid())), 0o644); err != nil {
			return err
		}
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	select {
	case err := <-errc:
		return err
	case <-sig:
		return nil
	}
}

func serveUDP(pc net.PacketConn, name string) error {
	buf := make([]byte, 2048)
	for {
		n, addr, err := pc.ReadFrom(buf)
		if err != nil {
			return err
		}
		reply := name + "\n"
		if strings.TrimSpace(string(buf[:n])) == "whoami" {
			reply = fmt.Sprintf("%s %s\n", name, addr)
		}
		_, _ = pc.WriteTo([]byte(reply), addr)
	}
}

type hitResult struct {
	OK           int            `json:"ok"`
	Errors       int            `json:"errors"`
	Counts       map[string]int `json:"counts"`
	Sequence     []string       `json:"sequence"`
	ErrorSamples []string       `json:"error_samples,omitempty"`
}

func hit(args []string) error {
	fs := flag.NewFlagSet("hit", flag.ExitOnError)
	n := fs.Int("n", 10, "number of requests (each on a new connection)")
	udp := fs.Bool("udp", false, "send UDP datagrams to HOST:PORT instead of HTTP GETs")
	timeout := fs.Duration("timeout", 2*time.Second, "timeout of each request")
	interval := fs.Duration("interval", 0, "pause between requests")
	local := fs.String("local", "", "source IP address to send from")
	_ = fs.Parse(args)
	if fs.NArg() != 1 {
		return errors.New("hit: need exactly one URL or HOST:PORT")
	}
	target := fs.Arg(0)

	var localAddr net.Addr
	if *local != "" {
		ip := net.ParseIP(*local)
		if ip == nil {
			return fmt.Errorf("hit: bad -local %q", *local)
		}
		if *udp {
			localAddr = &net.UDPAddr{IP: ip}
		} else {
			localAddr = &net.TCPAddr{IP: ip}
		}
	}
	dialer := &net.Dialer{Timeout: *timeout, LocalAddr: localAddr}
	client := &http.Client{
		Timeout: *timeout,
		Transport: &http.Transport{
			DisableKeepAlives: true, // one connection per request: IPVS schedules connections
			DialContext:       dialer.DialContext,
			Proxy:             nil,
		},
	}

	res := hitResult{Counts: map[string]int{}, Sequence: []string{}}
	for i := 0; i < *n; i++ {
		if i > 0 && *interval > 0 {
			time.Sleep(*interval)
		}
		var name string
		var err error
		if *udp {
			name, err = udpOnce(dialer, target, *timeout)
		} else {
			name, err = httpOnce(client, target)
		}
		if err != nil {
			res.Errors++
			res.Sequence = append(res.Sequence, "!error")
			if len(res.ErrorSamples) < 5 {
				res.ErrorSamples = append(res.ErrorSamples, err.Error())
			}
			continue
		}
		res.OK++
		res.Counts[name]++
		res.Sequence = append(res.Sequence, name)
	}
	return json.NewEncoder(os.Stdout).Encode(res)
}

func firstWord(b []byte) (string, error) {
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return "", errors.New("empty answer")
	}
	return f[0], nil
}

func httpOnce(c *http.Client, url string) (string, error) {
	resp, err := c.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("HTTP %d", resp.StatusCode)
	}
	return firstWord(body)
}

func udpOnce(d *net.Dialer, addr string, timeout time.Duration) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	conn, err := d.DialContext(ctx, "udp", addr)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(timeout))
	if _, err := conn.Write([]byte("name\n")); err != nil {
		return "", err
	}
	buf := make([]byte, 2048)
	n, err := conn.Read(buf)
	if err != nil {
		return "", err
	}
	return firstWord(buf[:n])
}
