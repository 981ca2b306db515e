package main

import (
	"bufio"
	"fmt"
	"log"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/vipd/vipd/kernel/ipvs"
	"github.com/vipd/vipd/lb"
)

// The floor of a one-backend change in this guest: what any daemon that
// takes its configuration from a file pays, whatever it does with it.
// floorChild is such a daemon reduced to the minimum: woken by inotify
// when a file is renamed into place, it reads the file (a weight) and
// sends one IPVS netlink request, with none of vipd's parsing,
// validation, reading of the service from the kernel, planning or
// logging. benchrun runs it as a child named "vipd", so that the same
// kretprobe times it exactly as it times vipd, on the same service.

// floorFlag, as the first argument, makes benchrun the floor's child.
const floorFlag = "-floor-child"

// floorChild runs the floor daemon: args are the network namespace's
// path, the directory to watch, and the service's VIP, port and backend.
// It prints "ready" once it watches, and runs until killed.
func floorChild(args []string) error {
	if len(args) != 5 {
		return fmt.Errorf("floor: want NETNS DIR VIP PORT BACKEND, got %q", args)
	}
	vip, err := netip.ParseAddr(args[2])
	if err != nil {
		return err
	}
	port, err := strconv.Atoi(args[3])
	if err != nil {
		return err
	}
	be, err := netip.ParseAddrPort(args[4])
	if err != nil {
		return err
	}
	a, err := ipvs.New(ipvs.Options{NetnsPath: args[0]})
	if err != nil {
		return err
	}
	key := lb.ServiceKey{Family: lb.IPv4, Proto: lb.TCP, Addr: vip, Port: uint16(port)}
	st, err := a.Service(key)
	if err != nil || st == nil {
		return fmt.Errorf("floor: service %s: %v", key, err)
	}
	d, ok := st.Dests[be]
	if !ok {
		return fmt.Errorf("floor: service %s has no backend %s", key, be)
	}
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return err
	}
	if err := w.Add(args[1]); err != nil {
		return err
	}
	fmt.Println("ready")
	for ev := range w.Events {
		if filepath.Base(ev.Name) != floorFile || !ev.Has(fsnotify.Create) {
			continue
		}
		data, err := os.ReadFile(ev.Name)
		if err != nil {
			return err
		}
		if d.Weight, err = strconv.Atoi(strings.TrimSpace(string(data))); err != nil {
			return err
		}
		if errs := a.Apply([]lb.Op{{Kind: lb.OpUpdateDest, Service: st.Service, Dest: d}}); errs[0] != nil {
			return errs[0]
		}
	}
	return nil
}

// floorFile is the file whose renames the floor daemon watches.
const floorFile = "weight"

// measureFloor times the floor daemon's one-backend changes on the changed
// service of ff in namespace ns, as vipdChanges times vipd's, with n
// changes. vipd must not be running there.
func measureFloor(n int, ns *namespace, a *ipvs.IPVS, ff *fixtureFiles, tr *setTracer) *Change {
	c := &Change{Layout: "floor", File: floorFile}
	fail := func(err error) *Change {
		c.Err = err.Error()
		return c
	}
	dir := filepath.Join(ff.dir, "floor")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fail(err)
	}
	self, err := os.Executable()
	if err != nil {
		return fail(err)
	}
	// The probe's filter is comm == "vipd": the child is run through a
	// link of that name.
	link := filepath.Join(dir, "vipd")
	os.Remove(link)
	if err := os.Symlink(self, link); err != nil {
		return fail(err)
	}
	cmd := exec.Command(link, floorFlag, ns.path(), dir, ff.changeKey.Addr.String(), strconv.Itoa(int(ff.changeKey.Port)), ff.changeAddr.String())
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return fail(err)
	}
	if err := cmd.Start(); err != nil {
		return fail(err)
	}
	defer func() {
		cmd.Process.Kill()
		cmd.Wait()
	}()
	ready := make(chan error, 1)
	go func() {
		sc := bufio.NewScanner(out)
		if sc.Scan() && sc.Text() == "ready" {
			ready <- nil
			return
		}
		ready <- fmt.Errorf("the floor daemon did not start: %v", sc.Err())
	}()
	select {
	case err := <-ready:
		if err != nil {
			return fail(err)
		}
	case <-time.After(30 * time.Second):
		return fail(fmt.Errorf("the floor daemon did not start in 30s"))
	}
	if err := tr.start(); err != nil {
		return fail(err)
	}
	stray := 0
	path := filepath.Join(dir, floorFile)
	got := timeChanges(n, time.Minute, func(i int) (int64, error) {
		stray += tr.drain()
		return writeAtomic(path, []byte(strconv.Itoa([]int{2, 1}[i%2])+"\n"))
	}, func(w int, t0 int64, timeout time.Duration) (int64, error) {
		t, skipped, err := tr.waitSet(a, ff, w, t0, timeout)
		stray += skipped
		return t, err
	}, nil)
	if err := tr.record(false); err != nil && got.Err == "" {
		got.Err = err.Error()
	}
	got.Layout, got.File, got.Stray = c.Layout, c.File, stray
	log.Printf("floor change: %v ms", got.MS)
	return got
}
