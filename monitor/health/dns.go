package health

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"strings"

	"golang.org/x/net/dns/dnsmessage"
)

// DNSCheck is up when a DNS server at its address answers a query with
// NOERROR (and, if asked, with a record of the queried type).
type DNSCheck struct {
	addr   string
	q      dnsmessage.Question
	opts   DNSOptions
	dialer *net.Dialer
}

// NewDNSCheck returns a check that queries the server at addr.
func NewDNSCheck(addr netip.AddrPort, opts DNSOptions, dial DialOptions) (*DNSCheck, error) {
	opts = opts.WithDefaults()
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	name := dnsmessage.MustNewName(fqdn(opts.Name))
	qtype, _ := dnsType(opts.Type) // Validate checked it
	network := "udp"
	if opts.TCP {
		network = "tcp"
	}
	return &DNSCheck{
		addr:   addr.String(),
		q:      dnsmessage.Question{Name: name, Type: qtype, Class: dnsmessage.ClassINET},
		opts:   opts,
		dialer: dialerFor(dial, network),
	}, nil
}

// Probe sends one query and judges the reply.
func (c *DNSCheck) Probe(ctx context.Context) error {
	id := uint16(rand.Uint32())
	msg := dnsmessage.Message{
		Header:    dnsmessage.Header{ID: id, RecursionDesired: !c.opts.NoRecursion},
		Questions: []dnsmessage.Question{c.q},
	}
	query, err := msg.Pack()
	if err != nil {
		return fmt.Errorf("pack dns query: %w", err)
	}
	network := "udp"
	if c.opts.TCP {
		network = "tcp"
	}
	conn, err := c.dialer.DialContext(ctx, network, c.addr)
	if err != nil {
		return err
	}
	defer conn.Close()
	stop := deadlineFromContext(ctx, conn)
	defer stop()

	var reply []byte
	if c.opts.TCP {
		reply, err = exchangeTCP(conn, query)
	} else {
		reply, err = exchangeUDP(conn, query)
	}
	if err != nil {
		return udpError("no dns reply from", c.addr, err)
	}
	return c.judge(reply, id)
}

func exchangeUDP(conn net.Conn, query []byte) ([]byte, error) {
	if _, err := conn.Write(query); err != nil {
		return nil, err
	}
	buf := make([]byte, maxReply)
	n, err := conn.Read(buf)
	if err != nil {
		return nil, err
	}
	return buf[:n], nil
}

func exchangeTCP(conn net.Conn, query []byte) ([]byte, error) {
	framed := make([]byte, 2+len(query))
	binary.BigEndian.PutUint16(framed, uint16(len(query)))
	copy(framed[2:], query)
	if _, err := conn.Write(framed); err != nil {
		return nil, err
	}
	var length [2]byte
	if _, err := io.ReadFull(conn, length[:]); err != nil {
		return nil, err
	}
	reply := make([]byte, binary.BigEndian.Uint16(length[:]))
	if _, err := io.ReadFull(conn, reply); err != nil {
		return nil, err
	}
	return reply, nil
}

// judge checks a reply against the query it answers.
func (c *DNSCheck) judge(reply []byte, id uint16) error {
	var p dnsmessage.Parser
	h, err := p.Start(reply)
	if err != nil {
		return fmt.Errorf("parse dns reply from %s: %w", c.addr, err)
	}
	if !h.Response || h.ID != id {
		return fmt.Errorf("dns reply from %s does not answer the query", c.addr)
	}
	qs, err := p.AllQuestions()
	if err != nil {
		return fmt.Errorf("parse dns reply from %s: %w", c.addr, err)
	}
	if len(qs) != 1 || qs[0].Type != c.q.Type || qs[0].Class != c.q.Class || !strings.EqualFold(qs[0].Name.String(), c.q.Name.String()) {
		return fmt.Errorf("dns reply from %s is for another question", c.addr)
	}
	if h.RCode != dnsmessage.RCodeSuccess {
		return fmt.Errorf("dns %s %s: %s", c.q.Name, c.opts.Type, strings.TrimPrefix(h.RCode.String(), "RCode"))
	}
	if !c.opts.ExpectAnswer {
		return nil
	}
	for {
		ah, err := p.AnswerHeader()
		if errors.Is(err, dnsmessage.ErrSectionDone) {
			break
		}
		if err != nil {
			return fmt.Errorf("parse dns reply from %s: %w", c.addr, err)
		}
		if ah.Type == c.q.Type {
			return nil
		}
		if err := p.SkipAnswer(); err != nil {
			return fmt.Errorf("parse dns reply from %s: %w", c.addr, err)
		}
	}
	if h.Truncated {
		return fmt.Errorf("dns reply from %s was truncated before any %s record; query over tcp", c.addr, c.opts.Type)
	}
	return fmt.Errorf("dns %s has no %s record", c.q.Name, c.opts.Type)
}
