package health

import (
	"net"
	"syscall"
)

// dialerFor returns a dialer for network ("tcp" or "udp") that applies o.
func dialerFor(o DialOptions, network string) *net.Dialer {
	d := &net.Dialer{KeepAlive: -1}
	if o.Source.IsValid() {
		ip := net.IP(o.Source.AsSlice())
		if network == "udp" {
			d.LocalAddr = &net.UDPAddr{IP: ip}
		} else {
			d.LocalAddr = &net.TCPAddr{IP: ip}
		}
	}
	if o.Mark != 0 || o.Device != "" {
		d.Control = func(network, address string, c syscall.RawConn) error { return dialControl(o, network, address, c) }
	}
	return d
}
