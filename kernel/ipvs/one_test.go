package ipvs

import (
	"net/netip"

	"github.com/vipd/vipd/lb"
)

// The tests' single-operation forms of Apply: each is a batch of one, the
// path production takes for one change.

func (i *IPVS) one(op lb.Op) error { return i.Apply([]lb.Op{op})[0] }

func (i *IPVS) AddService(s lb.Service) error {
	return i.one(lb.Op{Kind: lb.OpAddService, Service: s})
}

func (i *IPVS) UpdateService(s lb.Service) error {
	return i.one(lb.Op{Kind: lb.OpUpdateService, Service: s})
}

func (i *IPVS) DeleteService(key lb.ServiceKey) error {
	return i.one(lb.Op{Kind: lb.OpDeleteService, Service: lb.Service{Key: key}})
}

func (i *IPVS) AddDest(key lb.ServiceKey, d lb.Destination) error {
	return i.one(lb.Op{Kind: lb.OpAddDest, Service: lb.Service{Key: key}, Dest: d})
}

func (i *IPVS) UpdateDest(key lb.ServiceKey, d lb.Destination) error {
	return i.one(lb.Op{Kind: lb.OpUpdateDest, Service: lb.Service{Key: key}, Dest: d})
}

func (i *IPVS) DeleteDest(key lb.ServiceKey, addr netip.AddrPort) error {
	return i.one(lb.Op{Kind: lb.OpDeleteDest, Service: lb.Service{Key: key}, Dest: lb.Destination{Addr: addr, Forward: lb.Masq}})
}
