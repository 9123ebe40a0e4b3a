// Command migcheck checks a mig-parted configuration file against NVIDIA's own code: profile
// names go through go-nvlib's MIG profile parser (the one mig-parted uses when it reads
// `mig-devices`), and for entries whose `device-filter` names a GPU that go-nvml ships an NVML
// mock of, every profile must be one that go-nvlib enumerates on that GPU and no profile may be
// asked for more often than NVML's per-profile instance count allows.
//
// Usage: migcheck FILE. Prints one line per problem and exits 1 when there is any; prints
// "ok: N entries checked, M without a mock" and exits 0 otherwise.
package main

import (
	"fmt"
	"os"
	"sort"
	"strings"

	nvdev "github.com/NVIDIA/go-nvlib/pkg/nvlib/device"
	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/gpus"
	"sigs.k8s.io/yaml"
)

// The PCI device ids mig-parted's default config filters on, mapped to go-nvml's mock of that
// GPU (the mocks carry their own, partly different, ids, so they are not matched by id).
var mocked = map[string]gpus.Config{
	"0x20B010DE": gpus.A100_SXM4_40GB,
	"0x20B210DE": gpus.A100_SXM4_80GB,
	"0x20B710DE": gpus.A30_PCIE_24GB,
	"0x233010DE": gpus.H100_SXM5_80GB,
	"0x233510DE": gpus.H200_SXM5_141GB,
	"0x290110DE": gpus.B200_SXM5_180GB,
}

type entry struct {
	DeviceFilter interface{}    `json:"device-filter"`
	Devices      interface{}    `json:"devices"`
	MigEnabled   bool           `json:"mig-enabled"`
	MigDevices   map[string]int `json:"mig-devices"`
}

type spec struct {
	Version    string             `json:"version"`
	MigConfigs map[string][]entry `json:"mig-configs"`
}

// profileLimits: profile name -> instances NVML allows of it alone on the GPU, as go-nvlib names
// the profiles of one mocked device (full-size compute instances only: what mig-parted creates).
func profileLimits(cfg gpus.Config) (map[string]int, error) {
	server := dgxh100.NewWithGPUs(cfg)
	lib := nvdev.New(server)
	devices, err := lib.GetDevices()
	if err != nil || len(devices) != 1 {
		return nil, fmt.Errorf("mock %s: %v", cfg.Name, err)
	}
	profiles, err := devices[0].GetMigProfiles()
	if err != nil {
		return nil, fmt.Errorf("mock %s: %v", cfg.Name, err)
	}
	limits := map[string]int{}
	for _, p := range profiles {
		info := p.GetInfo()
		if info.C != info.G {
			continue
		}
		gi, ret := devices[0].GetGpuInstanceProfileInfo(info.GIProfileID)
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("mock %s: profile %d: %v", cfg.Name, info.GIProfileID, ret)
		}
		limits[p.String()] = int(gi.InstanceCount)
	}
	return limits, nil
}

func filters(v interface{}) []string {
	switch f := v.(type) {
	case string:
		return []string{f}
	case []interface{}:
		out := []string{}
		for _, x := range f {
			if s, ok := x.(string); ok {
				out = append(out, s)
			}
		}
		return out
	}
	return nil
}

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: migcheck FILE")
		os.Exit(2)
	}
	raw, err := os.ReadFile(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	var s spec
	if err := yaml.Unmarshal(raw, &s); err != nil {
		fmt.Printf("%s: not a mig-parted spec: %v\n", os.Args[1], err)
		os.Exit(1)
	}
	lib := nvdev.New(dgxh100.New())
	problems := []string{}
	checked, unmocked := 0, 0
	names := make([]string, 0, len(s.MigConfigs))
	for name := range s.MigConfigs {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		for i, e := range s.MigConfigs[name] {
			where := fmt.Sprintf("mig-configs.%s[%d]", name, i)
			checked++
			for profile := range e.MigDevices {
				if err := lib.AssertValidMigProfileFormat(profile); err != nil {
					problems = append(problems, fmt.Sprintf("%s: %v", where, err))
				}
			}
			ids := filters(e.DeviceFilter)
			if !e.MigEnabled || len(ids) == 0 {
				continue
			}
			for _, id := range ids {
				cfg, ok := mocked[normalise(id)]
				if !ok {
					unmocked++
					continue
				}
				limits, err := profileLimits(cfg)
				if err != nil {
					problems = append(problems, fmt.Sprintf("%s: %v", where, err))
					continue
				}
				for profile, count := range e.MigDevices {
					limit, known := limits[profile]
					if !known {
						problems = append(problems, fmt.Sprintf("%s: %s is not a MIG profile of %s", where, profile, cfg.Name))
					} else if count > limit {
						problems = append(problems, fmt.Sprintf("%s: %d x %s exceeds NVML's %d on %s", where, count, profile, limit, cfg.Name))
					}
				}
			}
		}
	}
	for _, p := range problems {
		fmt.Println(p)
	}
	if len(problems) > 0 {
		os.Exit(1)
	}
	fmt.Printf("ok: %d entries checked, %d without a mock\n", checked, unmocked)
}

// normalise writes a PCI device id as mig-parted's default config does: 0x + upper-case hex.
func normalise(id string) string {
	return "0x" + strings.ToUpper(strings.TrimPrefix(strings.ToLower(id), "0x"))
}
