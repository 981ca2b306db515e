package link

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"time"

	"github.com/vishvananda/netlink"
)

// resubscribeAfter is how long Watch waits before it subscribes to the
// link messages again, when subscribing failed or its subscription ended
// with an error (ENOBUFS: the kernel dropped messages not read in time).
const resubscribeAfter = 100 * time.Millisecond

// Watch subscribes to the link messages (RTM_NEWLINK, RTM_DELLINK) of
// the caller's network namespace, and sends on the returned channel,
// without blocking (one pending signal at most), on every message and
// each time the subscription starts, at first and again after it
// failed, since messages may have been lost meanwhile: the receiver
// looks at the interfaces it cares about, so that a lost message costs
// no more than a late one. It stops when ctx ends.
func Watch(ctx context.Context, log *slog.Logger) <-chan struct{} {
	ch := make(chan struct{}, 1)
	poke := func() {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
	go func() {
		failing := false
		for {
			updates := make(chan netlink.LinkUpdate, 16)
			errc := make(chan error, 1)
			err := netlink.LinkSubscribeWithOptions(updates, ctx.Done(), netlink.LinkSubscribeOptions{
				ErrorCallback: func(err error) {
					select {
					case errc <- err:
					default:
					}
				},
			})
			if err == nil {
				if failing {
					log.Info("link messages received again")
					failing = false
				}
				poke()
				for range updates {
					poke()
				}
				select {
				case err = <-errc:
				default:
					err = errors.New("subscription ended")
				}
			}
			if ctx.Err() != nil {
				return
			}
			if !failing {
				log.Warn("link messages lost; subscribing again (interfaces are checked every second meanwhile)", "err", err)
				failing = true
			}
			poke()
			select {
			case <-ctx.Done():
				return
			case <-time.After(resubscribeAfter):
			}
		}
	}()
	return ch
}

// Up reports whether the interface name is up with a carrier (or, as a
// dummy or loopback interface, has no carrier to lose).
func Up(name string) (bool, error) {
	l, err := netlink.LinkByName(name)
	if err != nil {
		return false, err
	}
	a := l.Attrs()
	if a.Flags&net.FlagUp == 0 {
		return false, nil
	}
	return a.OperState == netlink.OperUp || a.OperState == netlink.OperUnknown, nil
}
