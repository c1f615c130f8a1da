package main

import (
	"errors"

	"github.com/spf13/cobra"
)

func (c *cli) doctorCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "doctor",
		Short: "Check this machine for what sandboxd needs",
		Args:  exactArgs(),
		RunE:  func(cmd *cobra.Command, _ []string) error { return errors.New("not yet") },
	}
}
