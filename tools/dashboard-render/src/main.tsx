// Mounts one Perses dashboard (gpulens' converted JSON) against a Prometheus, with no Perses server,
// and tells the page how each panel fared: tests/dashboards/test_render.py opens it in Chromium.
//
// The test sets `window.gpulensRender = {dashboard, prometheus}` before this script runs; the page
// then answers `window.gpulensPanels()`: one state per panel of the dashboard (see PanelState).
import React from 'react';
import { createRoot } from 'react-dom/client';
import { BrowserRouter } from 'react-router-dom';
import { QueryParamProvider } from 'use-query-params';
import { ReactRouter6Adapter } from 'use-query-params/adapters/react-router-6';
import { QueryClient, QueryClientProvider } from '@tanstack/react-query';
import { ThemeProvider, CssBaseline } from '@mui/material';
import { ChartsProvider, SnackbarProvider, generateChartsTheme, getTheme } from '@perses-dev/components';
import { DashboardResource, GlobalDatasourceResource } from '@perses-dev/core';
import { PluginRegistry, dynamicImportPluginLoader } from '@perses-dev/plugin-system';
import { ViewDashboard } from '@perses-dev/dashboards';
import * as prometheus from '@perses-dev/prometheus-plugin';
import * as timeseries from '@perses-dev/timeseries-chart-plugin';
import * as statChart from '@perses-dev/stat-chart-plugin';
import * as table from '@perses-dev/table-plugin';

interface RenderInput {
  dashboard: DashboardResource;
  prometheus: string;
}

// What the test reads for every panel of the dashboard.
interface PanelState {
  key: string; // the panel's key in spec.panels
  title: string;
  mounted: boolean; // its card is in the page and its plugin drew (no loading skeleton left)
  pending: boolean; // a query has not answered yet
  errors: string[]; // query errors and plugin render errors, as their text
  series: number; // series returned by all its queries together
  noData: boolean; // every query answered, none with a series
}

declare global {
  interface Window {
    gpulensRender: RenderInput;
    gpulensPanels: () => PanelState[];
  }
}

// A render is a picture of one moment: no auto refresh, which would refetch every query (and put
// every panel back into a loading state) while the test reads them.
const given = window.gpulensRender;
const input: RenderInput = {
  ...given,
  dashboard: { ...given.dashboard, spec: { ...given.dashboard.spec, refreshInterval: '0s' } },
};
const datasource: GlobalDatasourceResource = {
  kind: 'GlobalDatasource',
  metadata: { name: 'prometheus' } as GlobalDatasourceResource['metadata'],
  spec: { default: true, plugin: { kind: 'PrometheusDatasource', spec: { directUrl: input.prometheus } } },
};
const datasourceApi = {
  buildProxyUrl: () => '',
  getDatasource: () => Promise.resolve(undefined),
  getGlobalDatasource: (selector: { kind: string }) =>
    Promise.resolve(selector.kind === 'PrometheusDatasource' ? datasource : undefined),
  listDatasources: () => Promise.resolve([]),
  listGlobalDatasources: () => Promise.resolve([datasource]),
};

// Plugins come from the bundle itself (no module federation, no plugin server).
const pluginLoader = dynamicImportPluginLoader(
  [prometheus, timeseries, statChart, table].map((module) => ({
    resource: module.getPluginModule(),
    importPlugin: () => Promise.resolve(module),
  })),
);

const queryClient = new QueryClient({
  defaultOptions: { queries: { refetchOnWindowFocus: false, retry: false } },
});
const muiTheme = getTheme('light');
const chartsTheme = generateChartsTheme(muiTheme, {});

function cardTitle(card: Element): string {
  const id = card.getAttribute('aria-labelledby');
  const header = id ? document.getElementById(id) : null;
  return (header?.textContent ?? '').trim();
}

function errorText(error: unknown): string {
  if (error instanceof Error) return error.message;
  return String(error);
}

window.gpulensPanels = () => {
  const cards = Array.from(document.querySelectorAll('[data-testid="panel"]'));
  const cache = queryClient.getQueryCache().getAll();
  return Object.entries(input.dashboard.spec.panels).map(([key, panel]) => {
    const title = panel.spec.display.name;
    const card = cards.find((c) => cardTitle(c).startsWith(title));
    const errors: string[] = [];
    let series = 0;
    let pending = false;
    for (const definition of panel.spec.queries ?? []) {
      // the query as the panel runs it now (older runs, for other variable values, stay cached)
      const wanted = JSON.stringify(definition);
      const run = cache
        .filter((q) => q.isActive() && JSON.stringify((q.queryKey as unknown[])[0]) === wanted)
        .sort((a, b) => Math.max(b.state.dataUpdatedAt, b.state.errorUpdatedAt) - Math.max(a.state.dataUpdatedAt, a.state.errorUpdatedAt))[0];
      if (run === undefined || run.state.status === 'loading') pending = true;
      else if (run.state.status === 'error') errors.push(errorText(run.state.error));
      else series += ((run.state.data as { series?: unknown[] })?.series ?? []).length;
    }
    // errors the plugin threw while drawing end in the card's error alert
    card?.querySelectorAll('.MuiAlert-standardError').forEach((alert) => errors.push((alert.textContent ?? '').trim()));
    const drawn = !!card && !card.querySelector('.MuiSkeleton-root');
    return {
      key,
      title,
      mounted: drawn,
      pending,
      errors,
      series,
      noData: !pending && errors.length === 0 && series === 0,
    };
  });
};

function App(): React.ReactElement {
  return (
    <BrowserRouter>
      <QueryParamProvider adapter={ReactRouter6Adapter}>
        <ThemeProvider theme={muiTheme}>
          <CssBaseline />
          <ChartsProvider chartsTheme={chartsTheme}>
            <SnackbarProvider anchorOrigin={{ vertical: 'bottom', horizontal: 'right' }}>
              <QueryClientProvider client={queryClient}>
                <PluginRegistry pluginLoader={pluginLoader}>
                  <ViewDashboard
                    dashboardResource={input.dashboard}
                    datasourceApi={datasourceApi}
                    isReadonly={true}
                    isVariableEnabled={true}
                    isDatasourceEnabled={false}
                    isEditing={false}
                  />
                </PluginRegistry>
              </QueryClientProvider>
            </SnackbarProvider>
          </ChartsProvider>
        </ThemeProvider>
      </QueryParamProvider>
    </BrowserRouter>
  );
}

createRoot(document.getElementById('root') as HTMLElement).render(<App />);
