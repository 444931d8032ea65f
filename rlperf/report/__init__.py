"""What rlperf prints and draws: tables, the live dashboard, plots, and the statistics and number
formats they share."""
