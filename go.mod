module github.com/vipd/vipd

go 1.26.8

require (
	github.com/BurntSushi/toml v1.6.0
	github.com/fsnotify/fsnotify v1.10.1
	github.com/mdlayher/arp v0.0.0-20220512170110-6706a2966875
	github.com/mdlayher/ethernet v0.0.0-20220221185849-529eae5b6118
	github.com/mdlayher/ndp v1.1.0
	github.com/mdlayher/packet v1.0.0
	github.com/moby/ipvs v1.1.0
	github.com/spf13/cobra v1.10.2
	github.com/vishvananda/netlink v1.3.1
	github.com/vishvananda/netns v0.0.5
	golang.org/x/net v0.22.0
	golang.org/x/sys v0.18.0
)

require (
	github.com/inconshreveable/mousetrap v1.1.0 // indirect
	github.com/josharian/native v1.0.0 // indirect
	github.com/mdlayher/socket v0.2.1 // indirect
	github.com/sirupsen/logrus v1.9.0 // indirect
	github.com/spf13/pflag v1.0.9 // indirect
	golang.org/x/sync v0.0.0-20210220032951-036812b2e83c // indirect
	golang.org/x/text v0.14.0 // indirect
)
